import Foundation
import GRDB
import RelayLocalBackend
import RelayTestSupport

/// A test's backend database in the temporary directory, with its events file beside it: a path, its removal,
/// and connections of the test's own to the events file.
enum EventsFile {
    static func path(_ name: String) -> String {
        FileManager.default.temporaryDirectory.appendingPathComponent(uniqueName(name) + ".sqlite").path
    }

    /// Both files, with their WALs and shared memory.
    static func remove(_ path: String) {
        for file in [path, SubscriptionDatabase.eventsPath(forBackend: path)] {
            for suffix in ["", "-wal", "-shm"] { try? FileManager.default.removeItem(atPath: file + suffix) }
        }
    }

    /// A connection of its own to the events file, waiting while the relay's connections hold it.
    static func open(_ path: String) throws -> DatabaseQueue {
        var configuration = Configuration()
        configuration.busyMode = .timeout(10)
        return try DatabaseQueue(path: SubscriptionDatabase.eventsPath(forBackend: path), configuration: configuration)
    }

    /// The names of `table`'s indexes in the events file.
    static func indexes(_ path: String, of table: String) throws -> Set<String> {
        let queue = try open(path)
        defer { try? queue.close() }
        return try queue.read { db in
            Set(try String.fetchAll(db, sql: "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = ?", arguments: [table]))
        }
    }
}
