#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// The process's open-file limit.
enum FileDescriptorLimit {
    /// Raises the soft limit to the hard one, as Go's runtime and nginx's `worker_rlimit_nofile` do.
    /// systemd and most shells start services at a soft 1,024 with a hard limit far above; the
    /// relay's defaults (1,024 deliveries in flight, 512 inbound connections, the log's files) need more.
    static func raiseSoftLimitToHard() {
        var limit = rlimit()
        guard getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0, limit.rlim_cur < limit.rlim_max else { return }
        limit.rlim_cur = limit.rlim_max
        _ = setrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
    }
}
