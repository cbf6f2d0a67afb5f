import GRDBSQLite
import Glibc
import Synchronization

/// A SQLite VFS over the default one that writes a transaction's new WAL frames to the file in a few large
/// writes instead of two system calls per frame.
///
/// SQLite writes a WAL frame as two `pwrite`s, its 24-byte header and then its page. With the relay's
/// random index leaves that is about 17 frames, 34 calls, per notification, and ext4's work per call is
/// most of their cost (`docs/benchmarks.md`). Here the frames a write transaction appends to its WAL are
/// gathered in memory and written out in one `pwrite`:
/// - when the commit's last frame is written (its header names the database's size after the commit), so
///   every committed frame is in the file before SQLite syncs it (`synchronous = FULL`) and before SQLite
///   publishes it to readers in the wal-index, whatever the `synchronous` level;
/// - before a read of gathered bytes, a sync, a truncate, or a question about the file's size;
/// - before any write to bytes this transaction has already written (a page written again, checksums
///   rewritten), which goes straight to the file after them;
/// - when about 124 KiB is gathered.
///
/// Only frames of a transaction that has not committed ever wait in memory. They are dropped when the
/// connection takes or releases the WAL's write lock (seen on the database file, whose shared-memory locks
/// SQLite takes), so a rolled-back transaction's frames can never be written later over another writer's. A
/// failed write of gathered frames drops them and fails every later write and sync, and every read of
/// them, until the lock is released, so that transaction cannot commit. (SQLite goes on with a transaction
/// after `SQLITE_FULL` in a statement it can roll back alone: the refusal is what keeps one whose frames
/// were dropped from committing.) A crash loses gathered frames as it would lose the transaction they
/// belong to.
///
/// WALs are gathered only where SQLite writes no padding frames (the database file has
/// `SQLITE_IOCAP_POWERSAFE_OVERWRITE`, the unix VFS's default) and takes the WAL's locks through the VFS
/// (not after `PRAGMA locking_mode = EXCLUSIVE`); other files are the default VFS's own.
public enum GatheringWAL {
    /// The VFS's name (`sqlite3_vfs_find`).
    public static let name = "relay-gathering-wal"

    /// Registers the VFS as the process's default, once, over SQLite's `unix` VFS (whose file methods it
    /// relies on: version 3, and at most 0x1FFFF bytes per write). Every connection opened afterwards uses
    /// it. Over any other default VFS nothing is registered. Whether it was: `isRegistered`.
    public static func registerAsDefault() {
        _ = registered
    }

    /// Whether the VFS is registered (registering it first if it was not yet).
    public static var isRegistered: Bool { registered }

    private static let registered: Bool = {
        guard let base = sqlite3_vfs_find(nil), let baseName = base.pointee.zName, String(cString: baseName) == "unix" else { return false }
        let vfs = UnsafeMutablePointer<sqlite3_vfs>.allocate(capacity: 1)
        vfs.initialize(to: base.pointee)
        vfs.pointee.pNext = nil
        vfs.pointee.zName = UnsafePointer(strdup(name))
        vfs.pointee.pAppData = UnsafeMutableRawPointer(base)
        vfs.pointee.szOsFile = Int32(Layout.realOffset) + base.pointee.szOsFile
        vfs.pointee.xOpen = gatheringOpen
        return sqlite3_vfs_register(vfs, 1) == SQLITE_OK
    }()

    /// For tests, by WAL path: how many gathered writes were made (each one `pwrite` of one or more
    /// frames), and after how many more of them one fails, with `failure`, without writing anything.
    struct Watch: Sendable {
        var gatheredWrites = 0
        var failAfter: Int?
        /// The error the failing write returns: `SQLITE_IOERR_WRITE`, or `SQLITE_FULL` (a full disk).
        var failure = SQLITE_IOERR_WRITE
    }

    static let watches = Mutex<[String: Watch]>([:])
    /// Whether any WAL is watched: the hot path reads only this.
    static let watching = Atomic(false)

    /// Starts (or goes on) counting the gathered writes of the WAL at `path`; with `failAfter`, the write
    /// after that many more fails.
    static func watch(_ path: String, failAfter: Int? = nil, failure: Int32 = SQLITE_IOERR_WRITE) {
        watches.withLock { watches in
            watches[path, default: Watch()].failAfter = failAfter
            watches[path, default: Watch()].failure = failure
            watching.store(true, ordering: .releasing)
        }
    }

    /// Stops watching the WAL at `path`.
    static func unwatch(_ path: String) {
        watches.withLock { watches in
            watches[path] = nil
            if watches.isEmpty { watching.store(false, ordering: .releasing) }
        }
    }

    static func watched(_ path: String) -> Watch {
        watches.withLock { $0[path] ?? Watch() }
    }

    /// The error the next gathered write to the WAL at `path` is to fail with, or `SQLITE_OK`; counting it.
    fileprivate static func watchedWrite(_ path: String) -> Int32 {
        watches.withLock { watches in
            guard var watch = watches[path] else { return SQLITE_OK }
            defer { watches[path] = watch }
            if let failAfter = watch.failAfter {
                watch.failAfter = failAfter - 1
                if failAfter == 0 {
                    watch.failAfter = nil
                    return watch.failure
                }
            }
            watch.gatheredWrites += 1
            return SQLITE_OK
        }
    }

    /// The database files open on this VFS, by the name pointer SQLite opened them with: a WAL finds its
    /// database's link through `sqlite3_filename_database`, which returns that pointer.
    static let links = Mutex<[UInt: DatabaseLink]>([:])

    /// The memory SQLite gives a file: our `sqlite3_file` (its methods pointer), the state object's
    /// pointer, then the default VFS's file.
    enum Layout {
        static let stateOffset = MemoryLayout<sqlite3_file>.stride
        static let realOffset = (stateOffset + MemoryLayout<UnsafeMutableRawPointer>.stride + 15) / 16 * 16

        static func real(_ file: UnsafeMutablePointer<sqlite3_file>) -> UnsafeMutablePointer<sqlite3_file> {
            (UnsafeMutableRawPointer(file) + realOffset).assumingMemoryBound(to: sqlite3_file.self)
        }

        static func store(_ state: AnyObject, in file: UnsafeMutablePointer<sqlite3_file>) {
            (UnsafeMutableRawPointer(file) + stateOffset).storeBytes(of: Unmanaged.passRetained(state).toOpaque(), as: UnsafeMutableRawPointer.self)
        }

        static func state<State: AnyObject>(_ file: UnsafeMutablePointer<sqlite3_file>, as: State.Type) -> State {
            let raw = (UnsafeMutableRawPointer(file) + stateOffset).load(as: UnsafeMutableRawPointer.self)
            return Unmanaged<State>.fromOpaque(raw).takeUnretainedValue()
        }

        static func release(_ file: UnsafeMutablePointer<sqlite3_file>) {
            let raw = (UnsafeMutableRawPointer(file) + stateOffset).load(as: UnsafeMutableRawPointer.self)
            Unmanaged<AnyObject>.fromOpaque(raw).release()
        }
    }

    /// One connection's database file and the WAL it opened for it. Used only under that connection
    /// (SQLite calls one connection's files from one thread at a time).
    final class DatabaseLink: @unchecked Sendable {
        /// SQLite writes no padding frames to this database's WAL.
        let powersafe: Bool
        /// The connection asked for exclusive locking (`PRAGMA locking_mode = EXCLUSIVE`), under which SQLite
        /// takes the WAL's locks without telling the VFS: its WAL gathers nothing from then on.
        var exclusive = false
        /// The VFS saw this connection take the WAL's write lock and not release it yet. Frames are gathered
        /// only then: a connection that holds the lock without the VFS seeing it (exclusive locking mode,
        /// however it was set, on an attached database too) never has anything to drop at its release.
        var writeLockHeld = false
        /// The WAL's gathering state while it is open.
        var wal: WALState?

        init(powersafe: Bool) {
            self.powersafe = powersafe
        }
    }

    /// A database file's state: its link, and the key it is registered under.
    final class DatabaseState {
        let link: DatabaseLink
        let key: UInt

        init(link: DatabaseLink, key: UInt) {
            self.link = link
            self.key = key
        }
    }

    /// What a gathering WAL holds beside the `sqlite3_file` SQLite sees.
    final class WALState {
        let link: DatabaseLink
        let path: String
        /// Allocated at the first write: a reader's WAL never gathers anything.
        private var storage: UnsafeMutableRawPointer?
        var buffer: UnsafeMutableRawPointer {
            if let storage { return storage }
            let made = UnsafeMutableRawPointer.allocate(byteCount: capacity, alignment: 16)
            storage = made
            return made
        }
        /// The unix VFS writes at most 0x1FFFF bytes per `pwrite` (and fails a longer write as a full
        /// disk), so a gathered write stays under it: about 30 frames of 4 KB pages.
        let capacity = 128 * 1024 - 4096
        /// The file offset of the buffer's first byte, and how many bytes are gathered.
        var start: Int64 = 0
        var count = 0
        /// The end of the furthest byte written (gathered or not) since the write lock was taken, or -1:
        /// a write below it rewrites this transaction's bytes and goes to the file.
        var frontier: Int64 = -1
        /// The last gathered write was a frame header naming a commit: the page written next ends it.
        var commitPending = false
        /// Gathered bytes from here on could not be written and were dropped: writes, syncs and reads of
        /// them fail until the write lock is taken or released. -1: none were.
        var droppedFrom: Int64 = -1

        init(link: DatabaseLink, path: String) {
            self.link = link
            self.path = path
        }

        deinit {
            storage?.deallocate()
        }

        /// The write lock was taken or released: nothing gathered, written or dropped under an earlier
        /// holding of it counts any more.
        func resetForWriteLock() {
            count = 0
            frontier = -1
            commitPending = false
            droppedFrom = -1
        }

        /// Writes the gathered bytes to `real` in one write. On failure they are dropped, and the file
        /// refuses writes, syncs and reads of them until the write lock is taken or released (`droppedFrom`).
        func flush(_ real: UnsafeMutablePointer<sqlite3_file>) -> Int32 {
            guard count > 0 else { return SQLITE_OK }
            let injected = GatheringWAL.watching.load(ordering: .acquiring) ? GatheringWAL.watchedWrite(path) : SQLITE_OK
            let code = injected != SQLITE_OK ? injected : real.pointee.pMethods.pointee.xWrite!(real, buffer, Int32(count), start)
            if code != SQLITE_OK {
                droppedFrom = droppedFrom < 0 ? start : min(droppedFrom, start)
                commitPending = false
            }
            count = 0
            return code
        }
    }
}

/// The SQLite WAL frame header's size (`WAL_FRAME_HDRSIZE`).
private let frameHeaderSize: Int32 = 24

/// SQLite's extended I/O error codes (macros Swift does not import).
let SQLITE_IOERR_READ = SQLITE_IOERR | (1 << 8)
let SQLITE_IOERR_WRITE = SQLITE_IOERR | (3 << 8)
let SQLITE_IOERR_FSYNC = SQLITE_IOERR | (4 << 8)

private func gatheringOpen(
    _ vfs: UnsafeMutablePointer<sqlite3_vfs>?, _ name: sqlite3_filename?, _ file: UnsafeMutablePointer<sqlite3_file>?, _ flags: Int32,
    _ outFlags: UnsafeMutablePointer<Int32>?
) -> Int32 {
    guard let vfs, let file, let base = vfs.pointee.pAppData?.assumingMemoryBound(to: sqlite3_vfs.self) else { return SQLITE_MISUSE }
    let isWAL = flags & SQLITE_OPEN_WAL != 0
    let isDatabase = flags & SQLITE_OPEN_MAIN_DB != 0
    var link: GatheringWAL.DatabaseLink?
    if isWAL, let name, let database = sqlite3_filename_database(name) {
        link = GatheringWAL.links.withLock { $0[UInt(bitPattern: database)] }
    }
    guard let name, isDatabase || (isWAL && link?.powersafe == true) else {
        // Neither a database nor a WAL that can gather: the default VFS's file, in place.
        return base.pointee.xOpen!(base, name, file, flags, outFlags)
    }
    let real = GatheringWAL.Layout.real(file)
    file.pointee.pMethods = nil
    let code = base.pointee.xOpen!(base, name, real, flags, outFlags)
    guard code == SQLITE_OK, let methods = real.pointee.pMethods else {
        // SQLite closes a file whose open failed only when its methods are set: the default VFS's are on `real`.
        if real.pointee.pMethods != nil { _ = real.pointee.pMethods.pointee.xClose!(real) }
        return code == SQLITE_OK ? SQLITE_CANTOPEN : code
    }
    if let link {
        let state = GatheringWAL.WALState(link: link, path: String(cString: name))
        link.wal = state
        GatheringWAL.Layout.store(state, in: file)
        file.pointee.pMethods = UnsafePointer(walMethods)
        return SQLITE_OK
    }
    guard methods.pointee.iVersion >= 3, methods.pointee.xShmLock != nil else {
        // Not a file whose locks can be followed (the unix VFS's always are): the default VFS's, in place.
        _ = methods.pointee.xClose!(real)
        return base.pointee.xOpen!(base, name, file, flags, outFlags)
    }
    let powersafe = methods.pointee.xDeviceCharacteristics!(real) & SQLITE_IOCAP_POWERSAFE_OVERWRITE != 0
    let key = UInt(bitPattern: name)
    let state = GatheringWAL.DatabaseState(link: GatheringWAL.DatabaseLink(powersafe: powersafe), key: key)
    GatheringWAL.links.withLock { $0[key] = state.link }
    GatheringWAL.Layout.store(state, in: file)
    file.pointee.pMethods = UnsafePointer(databaseMethods)
    return SQLITE_OK
}

/// Made once, never written again and never freed: SQLite keeps the pointers in every open file.
nonisolated(unsafe) private let walMethods: UnsafeMutablePointer<sqlite3_io_methods> = {
    let methods = UnsafeMutablePointer<sqlite3_io_methods>.allocate(capacity: 1)
    methods.initialize(to: makeWALMethods())
    return methods
}()

nonisolated(unsafe) private let databaseMethods: UnsafeMutablePointer<sqlite3_io_methods> = {
    let methods = UnsafeMutablePointer<sqlite3_io_methods>.allocate(capacity: 1)
    methods.initialize(to: makeDatabaseMethods())
    return methods
}()

private func wal(_ file: UnsafeMutablePointer<sqlite3_file>) -> GatheringWAL.WALState {
    GatheringWAL.Layout.state(file, as: GatheringWAL.WALState.self)
}

/// `body` on the default VFS's file under a gathering WAL once what is gathered is written out, or the
/// error writing it failed with.
private func afterFlush(_ file: UnsafeMutablePointer<sqlite3_file>, _ body: (UnsafeMutablePointer<sqlite3_file>) -> Int32) -> Int32 {
    let real = GatheringWAL.Layout.real(file)
    let flushed = wal(file).flush(real)
    guard flushed == SQLITE_OK else { return flushed }
    return body(real)
}

/// The methods of a gathering WAL: new frames gathered, everything else on the default VFS's file.
private func makeWALMethods() -> sqlite3_io_methods {
    var methods = forwardingMethods()
    methods.xClose = { file in
        guard let file else { return SQLITE_MISUSE }
        // Anything still gathered belongs to a transaction that did not commit (a commit writes its frames
        // out): dropped, as closing the connection rolls it back.
        let state = wal(file)
        state.count = 0
        if state.link.wal === state { state.link.wal = nil }
        let real = GatheringWAL.Layout.real(file)
        let closed = real.pointee.pMethods.pointee.xClose!(real)
        GatheringWAL.Layout.release(file)
        file.pointee.pMethods = nil
        return closed
    }
    methods.xRead = { file, buffer, amount, offset in
        guard let file else { return SQLITE_MISUSE }
        let state = wal(file)
        let end = offset + Int64(amount)
        if state.droppedFrom >= 0, end > state.droppedFrom { return SQLITE_IOERR_READ }
        let real = GatheringWAL.Layout.real(file)
        // Only a read of gathered bytes needs them written first: the rest of the file is as SQLite wrote it.
        if state.count > 0, offset < state.start + Int64(state.count), end > state.start {
            let flushed = state.flush(real)
            guard flushed == SQLITE_OK else { return flushed }
        }
        return real.pointee.pMethods.pointee.xRead!(real, buffer, amount, offset)
    }
    methods.xWrite = { file, data, amount, offset in
        guard let file, let data else { return SQLITE_MISUSE }
        let state = wal(file)
        guard state.droppedFrom < 0 else { return SQLITE_IOERR_WRITE }
        let real = GatheringWAL.Layout.real(file)
        let end = offset + Int64(amount)
        if state.link.exclusive || !state.link.writeLockHeld {
            // No lock changes to drop gathered bytes at: none are gathered.
            let flushed = state.flush(real)
            guard flushed == SQLITE_OK else { return flushed }
            return real.pointee.pMethods.pointee.xWrite!(real, data, amount, offset)
        }
        if state.frontier >= 0, offset < state.frontier {
            // Bytes this transaction wrote before (a page written again, rewritten checksums): after what
            // is gathered, straight to the file, so no header SQLite publishes waits in memory.
            let flushed = state.flush(real)
            guard flushed == SQLITE_OK else { return flushed }
            state.frontier = max(state.frontier, end)
            return real.pointee.pMethods.pointee.xWrite!(real, data, amount, offset)
        }
        state.frontier = end
        // Not the continuation of what is gathered, or too large to gather with it: what is gathered goes first.
        if state.count > 0, offset != state.start + Int64(state.count) || state.count + Int(amount) > state.capacity {
            let flushed = state.flush(real)
            guard flushed == SQLITE_OK else { return flushed }
        }
        if Int(amount) > state.capacity {
            state.commitPending = false
            return real.pointee.pMethods.pointee.xWrite!(real, data, amount, offset)
        }
        if state.count == 0 { state.start = offset }
        (state.buffer + state.count).copyMemory(from: data, byteCount: Int(amount))
        state.count += Int(amount)
        if amount == frameHeaderSize {
            // Bytes 4–7 of a frame header: the database's size in pages after a commit, else zero.
            let bytes = data.assumingMemoryBound(to: UInt8.self)
            state.commitPending = bytes[4] | bytes[5] | bytes[6] | bytes[7] != 0
            return SQLITE_OK
        }
        if state.commitPending {
            // The commit's last page: every frame of the commit reaches the file before SQLite syncs or
            // publishes it. If they cannot, the commit fails here, and its frames are dropped.
            state.commitPending = false
            return state.flush(real)
        }
        return SQLITE_OK
    }
    methods.xTruncate = { file, size in
        guard let file else { return SQLITE_MISUSE }
        return afterFlush(file) { real in real.pointee.pMethods.pointee.xTruncate!(real, size) }
    }
    methods.xSync = { file, flags in
        guard let file else { return SQLITE_MISUSE }
        guard wal(file).droppedFrom < 0 else { return SQLITE_IOERR_FSYNC }
        return afterFlush(file) { real in real.pointee.pMethods.pointee.xSync!(real, flags) }
    }
    methods.xFileSize = { file, size in
        guard let file else { return SQLITE_MISUSE }
        return afterFlush(file) { real in real.pointee.pMethods.pointee.xFileSize!(real, size) }
    }
    methods.xFetch = { file, offset, amount, pointer in
        guard let file else { return SQLITE_MISUSE }
        return afterFlush(file) { real in real.pointee.pMethods.pointee.xFetch!(real, offset, amount, pointer) }
    }
    return methods
}

/// The methods of a database file: the default VFS's, and the WAL's write lock followed.
private func makeDatabaseMethods() -> sqlite3_io_methods {
    var methods = forwardingMethods()
    methods.xClose = { file in
        guard let file else { return SQLITE_MISUSE }
        let state = GatheringWAL.Layout.state(file, as: GatheringWAL.DatabaseState.self)
        GatheringWAL.links.withLock { links in
            if links[state.key] === state.link { links[state.key] = nil }
        }
        let real = GatheringWAL.Layout.real(file)
        let closed = real.pointee.pMethods.pointee.xClose!(real)
        GatheringWAL.Layout.release(file)
        file.pointee.pMethods = nil
        return closed
    }
    methods.xFileControl = { file, operation, argument in
        guard let file else { return SQLITE_MISUSE }
        if operation == SQLITE_FCNTL_PRAGMA, let argument {
            // `PRAGMA locking_mode = EXCLUSIVE`: [error, name, value], strings SQLite owns.
            let words = argument.assumingMemoryBound(to: UnsafeMutablePointer<CChar>?.self)
            if let name = words[1], let value = words[2], strcasecmp(name, "locking_mode") == 0, strcasecmp(value, "exclusive") == 0 {
                GatheringWAL.Layout.state(file, as: GatheringWAL.DatabaseState.self).link.exclusive = true
            }
        }
        let real = GatheringWAL.Layout.real(file)
        return real.pointee.pMethods.pointee.xFileControl!(real, operation, argument)
    }
    methods.xShmLock = { file, offset, count, flags in
        guard let file else { return SQLITE_MISUSE }
        // The WAL's write lock is the first of the shared-memory locks (`WAL_WRITE_LOCK`). Whether it is
        // taken or released, nothing gathered before counts: released, what is gathered belongs to a
        // transaction that rolled back, and written later it could land on another writer's frames.
        let real = GatheringWAL.Layout.real(file)
        guard flags & SQLITE_SHM_EXCLUSIVE != 0, offset == 0, count >= 1 else {
            return real.pointee.pMethods.pointee.xShmLock!(real, offset, count, flags)
        }
        let link = GatheringWAL.Layout.state(file, as: GatheringWAL.DatabaseState.self).link
        link.wal?.resetForWriteLock()
        link.writeLockHeld = false
        let code = real.pointee.pMethods.pointee.xShmLock!(real, offset, count, flags)
        if code == SQLITE_OK, flags & SQLITE_SHM_LOCK != 0 { link.writeLockHeld = true }
        return code
    }
    return methods
}
