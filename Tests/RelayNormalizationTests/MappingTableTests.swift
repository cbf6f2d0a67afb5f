import Foundation
import RelayCore
import RelayVerification
import Testing

/// The README's mapping tables (one per store, under "### Mapping tables") are the documentation of
/// what each store notification means. Every row must be exercised by at least one scenario file.
@Suite struct MappingTableTests {
    static let readme = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("../../README.md").standardizedFileURL

    /// `#### <title>` headings under "### Mapping tables" → the store they document.
    static let headings: [String: Store] = ["App Store": .apple, "Google Play": .google, "Stripe": .stripe, "Paddle": .paddle]

    /// Row keys per store: the first cell's backticked words joined by `/` (`EXPIRED/VOLUNTARY`), or `*`
    /// for the row about types no table knows.
    static func readmeRows() throws -> [Store: [String]] {
        let text = try String(contentsOf: readme, encoding: .utf8)
        guard let start = text.range(of: "### Mapping tables") else { return [:] }
        var rows: [Store: [String]] = [:]
        var current: Store?
        for line in text[start.upperBound...].split(separator: "\n", omittingEmptySubsequences: false) {
            if line.hasPrefix("## ") || line.hasPrefix("### ") { break }
            if line.hasPrefix("#### ") {
                current = headings[String(line.dropFirst(5)).trimmingCharacters(in: .whitespaces)]
                continue
            }
            guard let store = current, line.hasPrefix("| "), !line.hasPrefix("| ---") else { continue }
            let firstCell = line.dropFirst(2).prefix { $0 != "|" }
            if firstCell.trimmingCharacters(in: .whitespaces).hasPrefix("notification") { continue }  // the header row
            let words = firstCell.split(separator: "`", omittingEmptySubsequences: false).enumerated().filter { $0.offset % 2 == 1 }.map {
                String($0.element)
            }
            rows[store, default: []].append(words.isEmpty ? "" : words.joined(separator: "/"))
        }
        return rows
    }

    /// The keys each store's scenario files exercise, in the same form as the rows.
    static func scenarioKeys() -> [Store: Set<String>] {
        var keys: [Store: Set<String>] = [:]
        for scenario in Scenario.all {
            guard let store = scenario.document["store"]?.stringValue.flatMap(Store.init(rawValue:)) else { continue }
            let templates = scenario.document["templates"]?.objectValue ?? [:]
            for step in scenario.document["steps"]?.arrayValue ?? [] {
                let notification = resolveTemplates(step["notification"] ?? .null, templates)
                var type: String?
                var detail: String?
                switch store {
                case .apple:
                    type = notification["notificationType"]?.stringValue
                    detail = notification["subtype"]?.stringValue
                case .google:
                    let kind = DeveloperNotificationKind(notification)
                    type = kind.name
                    if kind == .voidedPurchase {
                        detail = notification["voidedPurchaseNotification"]?["productType"]?.int64Value == 1 ? "SUBSCRIPTION" : "ONE_TIME"
                    }
                case .stripe:
                    type = notification["type"]?.stringValue
                case .paddle:
                    type = notification["event_type"]?.stringValue
                }
                guard let type else { continue }
                keys[store, default: []].insert(type)
                if let detail { keys[store, default: []].insert("\(type)/\(detail)") }
            }
        }
        return keys
    }

    @Test func everyRowOfTheReadmesMappingTablesIsCoveredByAScenario() throws {
        let rows = try Self.readmeRows()
        let keys = Self.scenarioKeys()
        for store in Store.allCases {
            let storeRows = rows[store] ?? []
            #expect(!storeRows.isEmpty, "the README has no mapping table for \(store.rawValue)")
            let named = Set(storeRows.filter { $0 != "*" && !$0.isEmpty })
            for row in storeRows {
                if row.isEmpty {
                    Issue.record("a \(store.rawValue) row of the README's mapping table names no notification in backticks")
                } else if row == "*" {
                    // The row for unknown types: some scenario sends a type that no row names.
                    let unknown = (keys[store] ?? []).filter { key in
                        !key.contains("/") && !named.contains(key) && !named.contains { $0.hasPrefix(key + "/") }
                    }
                    #expect(!unknown.isEmpty, "no \(store.rawValue) scenario sends a notification type that the table does not name")
                } else {
                    #expect(keys[store]?.contains(row) == true, "README row `\(row)` (\(store.rawValue)) is covered by no scenario")
                }
            }
        }
    }
}
