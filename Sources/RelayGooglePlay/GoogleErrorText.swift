import RelayCore

extension StoreAPIError {
    /// Text from Google quoted in a message: at most 200 characters, without control characters.
    static func excerpt(_ text: String) -> String {
        let cleaned = String(String.UnicodeScalarView(text.unicodeScalars.filter { $0.value >= 0x20 && $0.value != 0x7F }))
        return cleaned.count > 200 ? cleaned.prefix(200) + "…" : cleaned
    }
}
