public import RelayCore

extension RelayConfiguration.GrandfatheringRule {
    /// Whether a verified AppTransaction meets every condition the rule gives: `originalApplicationVersion`
    /// below `originalAppVersionBelow` (dot-separated numbers; missing parts count as 0, so `1.9` < `1.9.1`),
    /// `originalPurchaseDate` before `purchasedBefore`. A condition whose field is absent or unreadable fails.
    public func matches(_ appTransaction: JSON) -> Bool {
        if let below = originalAppVersionBelow {
            guard let version = appTransaction["originalApplicationVersion"]?.stringValue,
                let ordering = Self.compareVersions(version, below), ordering < 0
            else { return false }
        }
        if let before = purchasedBefore {
            guard let purchased = appTransaction["originalPurchaseDate"]?.int64Value, purchased < before else { return false }
        }
        return true
    }

    /// The index of the first rule `appTransaction` meets, or nil.
    public static func firstMatch(_ rules: [Self], _ appTransaction: JSON) -> Int? {
        rules.firstIndex { $0.matches(appTransaction) }
    }

    /// -1, 0 or 1 comparing dot-separated numbers; nil when either is not such a version.
    static func compareVersions(_ a: String, _ b: String) -> Int? {
        func parts(_ text: String) -> [UInt64]? {
            let pieces = text.split(separator: ".", omittingEmptySubsequences: false)
            let numbers = pieces.map { piece in piece.allSatisfy(\.isASCII) ? UInt64(piece) : nil }
            return numbers.contains(nil) ? nil : numbers.compactMap { $0 }
        }
        guard let left = parts(a), let right = parts(b) else { return nil }
        for index in 0..<max(left.count, right.count) {
            let l = index < left.count ? left[index] : 0
            let r = index < right.count ? right[index] : 0
            if l != r { return l < r ? -1 : 1 }
        }
        return 0
    }
}
