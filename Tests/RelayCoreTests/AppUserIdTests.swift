import RelayCore
import Testing

/// `AppUser.hasControlCharacters` reads UTF-8 bytes; it must agree with Unicode's control category (Cc).
@Suite struct AppUserIdTests {
    @Test func theByteScanAgreesWithUnicodesControlCategoryForEveryScalarUpToTheSupplementaryPlanes() {
        var disagreements: [UInt32] = []
        for value in UInt32(0)...0x1_0100 {
            guard let scalar = Unicode.Scalar(value) else { continue }
            let id = "a" + String(Character(scalar)) + "b"
            if AppUser.hasControlCharacters(id) != (scalar.properties.generalCategory == .control) { disagreements.append(value) }
        }
        #expect(disagreements.isEmpty, "\(disagreements.prefix(10).map { String($0, radix: 16) })")
        #expect(!AppUser.hasControlCharacters("naïve user \"42\"/😀 $SuperwallAlias:Q1"))
        #expect(AppUser.hasControlCharacters("\u{85}") && AppUser.hasControlCharacters("user\u{0}") && AppUser.hasControlCharacters("\u{7F}"))
    }
}
