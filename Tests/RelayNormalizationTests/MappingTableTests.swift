import Foundation
import RelayCore
import RelayVerification
import Testing

/// The mapping tables (`docs/mappings/<store>.md`, one per store) are the documentation of what each
/// store notification means. Every row must be exercised by at least one scenario file.
@Suite struct MappingTableTests {
    static let docs = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("../../docs/mappings").standardizedFileURL

    /// Row keys per store: the first cell's backticked words joined by `/` (`EXPIRED/VOLUNTARY`), or `*`
    /// for the row about types no table knows. Only the first table of each file is the mapping.
    static func readmeRows() throws -> [Store: [String]] {
        var rows: [Store: [String]] = [:]
        for store in Store.allCases {
            let text = try String(contentsOf: docs.appendingPathComponent("\(store.rawValue).md"), encoding: .utf8)
            var inTable = false
            for line in text.split(separator: "\n", omittingEmptySubsequences: false) {
                guard line.hasPrefix("| ") else {
                    if inTable { break }
                    continue
                }
                inTable = true
                if line.hasPrefix("| ---") { continue }
                let firstCell = line.dropFirst(2).prefix { $0 != "|" }
                if firstCell.trimmingCharacters(in: .whitespaces).hasPrefix("notification") { continue }  // the header row
                let words = firstCell.split(separator: "`", omittingEmptySubsequences: false).enumerated().filter { $0.offset % 2 == 1 }.map {
                    String($0.element)
                }
                rows[store, default: []].append(words.isEmpty ? "" : words.joined(separator: "/"))
            }
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
                case .promotional:
                    type = notification["action"]?.stringValue
                }
                guard let type else { continue }
                keys[store, default: []].insert(type)
                if let detail { keys[store, default: []].insert("\(type)/\(detail)") }
            }
        }
        return keys
    }

    @Test func everyRowOfTheMappingTablesIsCoveredByAScenario() throws {
        let rows = try Self.readmeRows()
        let keys = Self.scenarioKeys()
        for store in Store.allCases {
            let storeRows = rows[store] ?? []
            #expect(!storeRows.isEmpty, "docs/mappings/\(store.rawValue).md has no mapping table")
            let named = Set(storeRows.filter { $0 != "*" && !$0.isEmpty })
            for row in storeRows {
                if row.isEmpty {
                    Issue.record("a \(store.rawValue) row of docs/mappings names no notification in backticks")
                } else if row == "*" {
                    // The row for unknown types: some scenario sends a type that no row names.
                    let unknown = (keys[store] ?? []).filter { key in
                        !key.contains("/") && !named.contains(key) && !named.contains { $0.hasPrefix(key + "/") }
                    }
                    #expect(!unknown.isEmpty, "no \(store.rawValue) scenario sends a notification type that the table does not name")
                } else {
                    #expect(keys[store]?.contains(row) == true, "docs/mappings row `\(row)` (\(store.rawValue)) is covered by no scenario")
                }
            }
        }
    }
}
