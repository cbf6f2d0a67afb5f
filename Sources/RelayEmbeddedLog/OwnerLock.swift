import Glibc
import RelayCore
import Synchronization

/// `owner.lock`, held with an exclusive `flock` for as long as the process lives (the kernel drops it when
/// the process ends, also on `kill -9`).
final class OwnerLock: Sendable {
    private let descriptor = Mutex<Int32>(-1)

    init(path: String, directory: String) throws {
        let descriptor = Glibc.open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0o644)
        guard descriptor >= 0 else {
            throw RecordLogError(code: .configuration, reason: "cannot open \(path): \(String(cString: strerror(errno)))", isRetriable: false)
        }
        guard flock(descriptor, LOCK_EX | LOCK_NB) == 0 else {
            close(descriptor)
            throw EmbeddedRecordLog.AlreadyOwned(directory: directory)
        }
        self.descriptor.withLock { $0 = descriptor }
    }

    /// Unlocks and closes the lock file; once.
    func release() {
        descriptor.withLock { descriptor in
            guard descriptor >= 0 else { return }
            flock(descriptor, LOCK_UN)
            close(descriptor)
            descriptor = -1
        }
    }

    deinit {
        release()
    }
}
