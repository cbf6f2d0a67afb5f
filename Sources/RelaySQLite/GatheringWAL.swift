import GRDBSQLite
import Glibc

/// A SQLite VFS over the default one that writes each WAL's frames to the file in a few large writes
/// instead of two system calls per frame.
///
/// SQLite writes a WAL frame as two `pwrite`s, its 24-byte header and then its page. With the relay's
/// random index leaves that is about 17 frames, 34 calls, per notification, and ext4's work per call is
/// most of their cost (`docs/benchmarks.md`). Here a WAL file's sequential writes are gathered in memory
/// and written out as one `pwrite`:
/// - when a commit's last frame is written (its header names the database's size after the commit), so
///   every committed frame is in the file before SQLite syncs it (`synchronous = FULL`) and before SQLite
///   publishes it to readers in the wal-index, whatever the `synchronous` setting;
/// - before a read of gathered bytes, and before anything else the file is asked for: a sync, a truncate,
///   its size, a lock, a file control, a close;
/// - before a write that does not continue the gathered bytes, and when about 124 KiB is gathered.
///
/// So what reaches the file, and when it is synced, is what SQLite wrote, in order; only frames of a
/// transaction that has not committed wait in memory, and a crash loses those as it would lose the
/// transaction. Files other than WALs are the default VFS's own.
public enum GatheringWAL {
    /// The VFS's name (`sqlite3_vfs_find`).
    public static let name = "relay-gathering-wal"

    /// Registers the VFS as the process's default, once, over SQLite's `unix` VFS (whose file methods it
    /// relies on: version 3, and at most 0x1FFFF bytes per write). Every connection opened afterwards uses
    /// it. Over any other default VFS nothing is registered. Whether it was: `isRegistered`.
    public static func registerAsDefault() {
        _ = registered
    }

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

    /// What a gathering file holds beside the `sqlite3_file` SQLite sees.
    final class State {
        /// Allocated at the first write: a reader's WAL never gathers anything.
        private var storage: UnsafeMutableRawPointer?
        var buffer: UnsafeMutableRawPointer {
            if let storage { return storage }
            let made = UnsafeMutableRawPointer.allocate(byteCount: capacity, alignment: 16)
            storage = made
            return made
        }
        /// The unix VFS writes at most 0x1FFFF bytes per `pwrite` (and fails a longer write as a full
        /// disk), so a flush stays under it: about 30 frames of 4 KB pages.
        let capacity = 128 * 1024 - 4096
        /// The file offset of the buffer's first byte, and how many bytes are gathered.
        var start: Int64 = 0
        var count = 0
        /// The last write was a frame header naming a commit: the page written next ends the commit.
        var commitPending = false

        deinit {
            storage?.deallocate()
        }
    }

    /// The memory SQLite gives a file: our `sqlite3_file` (its methods pointer), the state's pointer, then
    /// the default VFS's file.
    enum Layout {
        static let stateOffset = MemoryLayout<sqlite3_file>.stride
        static let realOffset = (stateOffset + MemoryLayout<UnsafeMutableRawPointer>.stride + 15) / 16 * 16

        static func real(_ file: UnsafeMutablePointer<sqlite3_file>) -> UnsafeMutablePointer<sqlite3_file> {
            (UnsafeMutableRawPointer(file) + realOffset).assumingMemoryBound(to: sqlite3_file.self)
        }

        static func state(_ file: UnsafeMutablePointer<sqlite3_file>) -> State {
            let raw = (UnsafeMutableRawPointer(file) + stateOffset).load(as: UnsafeMutableRawPointer.self)
            return Unmanaged<State>.fromOpaque(raw).takeUnretainedValue()
        }
    }

    /// Writes the gathered bytes to the file in one write. When that fails they stay gathered and every
    /// later flush tries them again, so no frame SQLite wrote is dropped while its transaction may still
    /// commit (some calls' errors, file controls', SQLite ignores): the commit's own flush fails the commit
    /// instead.
    static func flush(_ file: UnsafeMutablePointer<sqlite3_file>) -> Int32 {
        let state = Layout.state(file)
        guard state.count > 0 else { return SQLITE_OK }
        let real = Layout.real(file)
        let code = real.pointee.pMethods.pointee.xWrite!(real, state.buffer, Int32(state.count), state.start)
        if code == SQLITE_OK { state.count = 0 }
        return code
    }
}

/// The SQLite WAL frame header's size (`WAL_FRAME_HDRSIZE`).
private let frameHeaderSize: Int32 = 24

private func gatheringOpen(
    _ vfs: UnsafeMutablePointer<sqlite3_vfs>?, _ name: sqlite3_filename?, _ file: UnsafeMutablePointer<sqlite3_file>?, _ flags: Int32,
    _ outFlags: UnsafeMutablePointer<Int32>?
) -> Int32 {
    guard let vfs, let file, let base = vfs.pointee.pAppData?.assumingMemoryBound(to: sqlite3_vfs.self) else { return SQLITE_MISUSE }
    guard flags & SQLITE_OPEN_WAL != 0 else {
        // Not a WAL: the default VFS's file, in place.
        return base.pointee.xOpen!(base, name, file, flags, outFlags)
    }
    let real = GatheringWAL.Layout.real(file)
    file.pointee.pMethods = nil
    let code = base.pointee.xOpen!(base, name, real, flags, outFlags)
    guard code == SQLITE_OK, real.pointee.pMethods != nil else {
        // SQLite closes a file whose open failed only when its methods are set: the default VFS's are on `real`.
        if real.pointee.pMethods != nil { _ = real.pointee.pMethods.pointee.xClose!(real) }
        return code == SQLITE_OK ? SQLITE_CANTOPEN : code
    }
    let state = Unmanaged.passRetained(GatheringWAL.State()).toOpaque()
    (UnsafeMutableRawPointer(file) + GatheringWAL.Layout.stateOffset).storeBytes(of: state, as: UnsafeMutableRawPointer.self)
    file.pointee.pMethods = UnsafePointer(gatheringMethods)
    return SQLITE_OK
}

/// The methods of a gathering WAL: writes gathered, everything else after a flush, on the default VFS's
/// file. Made once, never written again and never freed (SQLite keeps the pointer in every open WAL).
nonisolated(unsafe) private let gatheringMethods: UnsafeMutablePointer<sqlite3_io_methods> = {
    let methods = UnsafeMutablePointer<sqlite3_io_methods>.allocate(capacity: 1)
    methods.initialize(to: makeGatheringMethods())
    return methods
}()

private func makeGatheringMethods() -> sqlite3_io_methods {
    sqlite3_io_methods(
        iVersion: 3,
        xClose: { file in
            guard let file else { return SQLITE_MISUSE }
            let flushed = GatheringWAL.flush(file)
            let real = GatheringWAL.Layout.real(file)
            let closed = real.pointee.pMethods.pointee.xClose!(real)
            let raw = (UnsafeMutableRawPointer(file) + GatheringWAL.Layout.stateOffset).load(as: UnsafeMutableRawPointer.self)
            Unmanaged<GatheringWAL.State>.fromOpaque(raw).release()
            file.pointee.pMethods = nil
            return flushed != SQLITE_OK ? flushed : closed
        },
        xRead: { file, buffer, amount, offset in
            guard let file else { return SQLITE_MISUSE }
            // Only a read of gathered bytes needs them written first: the rest of the file is as SQLite
            // wrote it. (The events store reads index pages of earlier commits between its writes.)
            let state = GatheringWAL.Layout.state(file)
            if state.count > 0, offset < state.start + Int64(state.count), offset + Int64(amount) > state.start {
                let flushed = GatheringWAL.flush(file)
                guard flushed == SQLITE_OK else { return flushed }
            }
            let real = GatheringWAL.Layout.real(file)
            return real.pointee.pMethods.pointee.xRead!(real, buffer, amount, offset)
        },
        xWrite: { file, data, amount, offset in
            guard let file, let data else { return SQLITE_MISUSE }
            let state = GatheringWAL.Layout.state(file)
            let real = GatheringWAL.Layout.real(file)
            // Not the continuation of what is gathered, or too large to gather: what is gathered goes first.
            if state.count > 0, offset != state.start + Int64(state.count) || state.count + Int(amount) > state.capacity {
                let flushed = GatheringWAL.flush(file)
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
                // publishes it. If they cannot, the commit fails here and its frames are dropped: kept, a
                // later flush could write a whole commit SQLite has rolled back, which recovery after a
                // crash would take for committed.
                state.commitPending = false
                let code = GatheringWAL.flush(file)
                if code != SQLITE_OK { state.count = 0 }
                return code
            }
            return SQLITE_OK
        },
        xTruncate: { file, size in
            guard let file else { return SQLITE_MISUSE }
            let flushed = GatheringWAL.flush(file)
            guard flushed == SQLITE_OK else { return flushed }
            let real = GatheringWAL.Layout.real(file)
            return real.pointee.pMethods.pointee.xTruncate!(real, size)
        },
        xSync: { file, flags in
            guard let file else { return SQLITE_MISUSE }
            let flushed = GatheringWAL.flush(file)
            guard flushed == SQLITE_OK else { return flushed }
            let real = GatheringWAL.Layout.real(file)
            return real.pointee.pMethods.pointee.xSync!(real, flags)
        },
        xFileSize: { file, size in
            guard let file else { return SQLITE_MISUSE }
            let flushed = GatheringWAL.flush(file)
            guard flushed == SQLITE_OK else { return flushed }
            let real = GatheringWAL.Layout.real(file)
            return real.pointee.pMethods.pointee.xFileSize!(real, size)
        },
        xLock: { file, level in
            guard let file else { return SQLITE_MISUSE }
            let flushed = GatheringWAL.flush(file)
            guard flushed == SQLITE_OK else { return flushed }
            let real = GatheringWAL.Layout.real(file)
            return real.pointee.pMethods.pointee.xLock!(real, level)
        },
        xUnlock: { file, level in
            guard let file else { return SQLITE_MISUSE }
            let flushed = GatheringWAL.flush(file)
            guard flushed == SQLITE_OK else { return flushed }
            let real = GatheringWAL.Layout.real(file)
            return real.pointee.pMethods.pointee.xUnlock!(real, level)
        },
        xCheckReservedLock: { file, result in
            guard let file else { return SQLITE_MISUSE }
            let real = GatheringWAL.Layout.real(file)
            return real.pointee.pMethods.pointee.xCheckReservedLock!(real, result)
        },
        xFileControl: { file, operation, argument in
            guard let file else { return SQLITE_MISUSE }
            let flushed = GatheringWAL.flush(file)
            guard flushed == SQLITE_OK else { return flushed }
            let real = GatheringWAL.Layout.real(file)
            return real.pointee.pMethods.pointee.xFileControl!(real, operation, argument)
        },
        xSectorSize: { file in
            guard let file else { return 4096 }
            let real = GatheringWAL.Layout.real(file)
            return real.pointee.pMethods.pointee.xSectorSize!(real)
        },
        xDeviceCharacteristics: { file in
            guard let file else { return 0 }
            let real = GatheringWAL.Layout.real(file)
            return real.pointee.pMethods.pointee.xDeviceCharacteristics!(real)
        },
        xShmMap: { file, page, size, extend, pointer in
            guard let file else { return SQLITE_MISUSE }
            let real = GatheringWAL.Layout.real(file)
            return real.pointee.pMethods.pointee.xShmMap!(real, page, size, extend, pointer)
        },
        xShmLock: { file, offset, count, flags in
            guard let file else { return SQLITE_MISUSE }
            let real = GatheringWAL.Layout.real(file)
            return real.pointee.pMethods.pointee.xShmLock!(real, offset, count, flags)
        },
        xShmBarrier: { file in
            guard let file else { return }
            let real = GatheringWAL.Layout.real(file)
            real.pointee.pMethods.pointee.xShmBarrier!(real)
        },
        xShmUnmap: { file, delete in
            guard let file else { return SQLITE_MISUSE }
            let real = GatheringWAL.Layout.real(file)
            return real.pointee.pMethods.pointee.xShmUnmap!(real, delete)
        },
        xFetch: { file, offset, amount, pointer in
            guard let file else { return SQLITE_MISUSE }
            let flushed = GatheringWAL.flush(file)
            guard flushed == SQLITE_OK else { return flushed }
            let real = GatheringWAL.Layout.real(file)
            return real.pointee.pMethods.pointee.xFetch!(real, offset, amount, pointer)
        },
        xUnfetch: { file, offset, pointer in
            guard let file else { return SQLITE_MISUSE }
            let real = GatheringWAL.Layout.real(file)
            return real.pointee.pMethods.pointee.xUnfetch!(real, offset, pointer)
        }
    )
}
