internal import CCurl
import Foundation
import RelayCore
import Synchronization

/// An HTTP response.
public struct HTTPClientResponse: Sendable {
    public var status: Int
    /// Header names lower-cased, in arrival order.
    public var headers: [(name: String, value: String)]
    public var body: [UInt8]
    /// Connections this request had to open (0 when it reused a kept-alive one).
    public var newConnections: Int = 0
    /// Whether the body was longer than the client keeps (the rest was read and discarded).
    public var bodyTruncated = false

    public init(status: Int, headers: [(name: String, value: String)], body: [UInt8], newConnections: Int = 0, bodyTruncated: Bool = false) {
        self.status = status
        self.headers = headers
        self.body = body
        self.newConnections = newConnections
        self.bodyTruncated = bodyTruncated
    }

    public func header(_ name: String) -> String? {
        let lowered = name.lowercased()
        return headers.first { $0.name == lowered }?.value
    }

    public var bodyText: String { String(decoding: body, as: UTF8.self) }
}

/// Why a request got no HTTP response.
public struct HTTPClientError: Error, Sendable, CustomStringConvertible {
    public enum Kind: String, Sendable {
        case setup, invalidRequest = "invalid_request", connect, timeout, transfer
        /// The address check refused the address a connection was about to reach (SSRF guard).
        case addressRefused = "address_refused"
        /// The engine was told to abort its transfers (a shutdown past its drain bound): nothing is known
        /// of whether the peer got the request.
        case aborted
    }

    public var kind: Kind
    /// libcurl's explanation; never contains the request body or headers.
    public var message: String
    public var isRetriable: Bool { kind == .connect || kind == .timeout || kind == .transfer }

    public init(kind: Kind, message: String) {
        self.kind = kind
        self.message = message
    }

    public var description: String { "\(kind.rawValue): \(message)" }
}

/// A small request/response HTTP client: a facade over `HTTPTransferEngine`, so the relay has one
/// libcurl client (one header check, one error mapping, one place that owns the handles). Transfers
/// run on the engine's own OS thread, never on Swift's cooperative pool; connections are kept alive
/// and reused; redirects are never followed; proxies from the environment (`https_proxy`, `no_proxy`)
/// are used. At most `maxConcurrentTransfers` requests run at once: the others wait here, before
/// their timeout starts (inside libcurl the wait would count against it). Copies share the engine; its
/// thread ends with the last copy.
public struct HTTPClient: Sendable {
    /// Connection timeout. Default: 5 s.
    public var connectTimeout: Duration = .seconds(5)
    /// Whole-request timeout. Default: 30 s.
    public var timeout: Duration = .seconds(30)
    private let engine: HTTPTransferEngine?
    private let slots: TransferSlots

    /// Response bodies this client keeps; a longer one is an error, not a cut document.
    static let maxResponseBytes = 16 * 1024 * 1024

    public init(connectTimeout: Duration = .seconds(5), timeout: Duration = .seconds(30), maxConcurrentTransfers: Int = 8) {
        self.connectTimeout = connectTimeout
        self.timeout = timeout
        let limit = max(1, maxConcurrentTransfers)
        var configuration = HTTPTransferEngine.Configuration()
        configuration.maxConnectionsPerHost = limit
        configuration.maxCachedConnections = limit * 4
        configuration.maxResponseBytes = Self.maxResponseBytes
        configuration.ignoresEnvironmentProxies = false
        // nil only when libcurl cannot make a multi handle (out of memory): every send then says so.
        self.engine = try? HTTPTransferEngine(configuration: configuration)
        self.slots = TransferSlots(limit)
    }

    public func send(
        _ method: String, _ url: String, headers: [(String, String)] = [], body: [UInt8]? = nil
    ) async throws(HTTPClientError) -> HTTPClientResponse {
        guard let engine else { throw HTTPClientError(kind: .setup, message: "libcurl could not create a multi handle") }
        let request = HTTPTransferRequest(
            url: url, method: method, headers: headers.map { (name: $0.0, value: $0.1) }, body: body ?? [],
            connectTimeout: connectTimeout, timeout: timeout)
        await slots.acquire()
        let result = await engine.send(request)
        slots.release()
        if let response = result.response {
            guard !response.bodyTruncated else {
                throw HTTPClientError(kind: .transfer, message: "the response body is longer than \(Self.maxResponseBytes) bytes")
            }
            return response
        }
        throw result.error ?? HTTPClientError(kind: .transfer, message: "no response")
    }
}

/// At most `limit` transfers at once; the others wait their turn in order.
private final class TransferSlots: Sendable {
    private struct State {
        var free: Int
        var waiting: [CheckedContinuation<Void, Never>] = []
    }

    private let state: Mutex<State>

    init(_ limit: Int) {
        state = Mutex(State(free: limit))
    }

    func acquire() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let granted = state.withLock { state -> Bool in
                if state.free > 0 {
                    state.free -= 1
                    return true
                }
                state.waiting.append(continuation)
                return false
            }
            if granted { continuation.resume() }
        }
    }

    func release() {
        let next = state.withLock { state -> CheckedContinuation<Void, Never>? in
            if state.waiting.isEmpty {
                state.free += 1
                return nil
            }
            return state.waiting.removeFirst()
        }
        next?.resume()
    }
}
