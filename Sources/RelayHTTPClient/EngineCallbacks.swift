internal import CCurl
import Foundation
import Glibc

// libcurl's callbacks into the engine (C function pointers: no captures; the loop or the transfer
// comes back through the context pointer given with them).

extension HTTPClientError {
    init(code: CURLcode) {
        let message = String(cString: curl_easy_strerror(code))
        let kind: Kind =
            switch code {
            case CURLE_COULDNT_CONNECT, CURLE_COULDNT_RESOLVE_HOST: .connect
            case CURLE_OPERATION_TIMEDOUT: .timeout
            case CURLE_URL_MALFORMAT, CURLE_UNSUPPORTED_PROTOCOL: .invalidRequest
            default: .transfer
            }
        self.init(kind: kind, message: message)
    }
}

func engineWatchSocket(
    _ easy: UnsafeMutableRawPointer?, _ socket: curl_socket_t, _ what: Int32, _ context: UnsafeMutableRawPointer?, _ socketContext: UnsafeMutableRawPointer?
) -> Int32 {
    guard let context else { return -1 }
    Unmanaged<TransferLoop>.fromOpaque(context).takeUnretainedValue().watch(socket, what)
    return 0
}

func engineSetTimer(_ multi: UnsafeMutableRawPointer?, _ timeoutMilliseconds: Int, _ context: UnsafeMutableRawPointer?) -> Int32 {
    guard let context else { return -1 }
    let loop = Unmanaged<TransferLoop>.fromOpaque(context).takeUnretainedValue()
    // At most a minute ahead (the loop wakes at least every second anyway): libcurl handles an early
    // CURL_SOCKET_TIMEOUT by setting the timer again, and a huge configured timeout cannot overflow.
    loop.timerDeadline =
        timeoutMilliseconds < 0 ? nil : DispatchTime.now().uptimeNanoseconds + UInt64(min(timeoutMilliseconds, 60_000)) * 1_000_000
    return 0
}

func engineOpenSocket(_ context: UnsafeMutableRawPointer?, _ purpose: curlsocktype, _ address: UnsafeMutablePointer<curl_sockaddr>?) -> curl_socket_t {
    guard let context, let address else { return CURL_SOCKET_BAD }
    let transfer = Unmanaged<Transfer>.fromOpaque(context).takeUnretainedValue()
    guard let check = transfer.addressCheck else { return openOwnSocket(address, for: transfer) }
    var text = [CChar](repeating: 0, count: 64)
    guard relay_curl_sockaddr_ip(address, &text, socklen_t(text.count)) == 0 else {
        transfer.refusal = "refused a connection to an address that is not IPv4 or IPv6"
        return CURL_SOCKET_BAD
    }
    let ip = String(decoding: text.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    if let reason = check(ip) {
        transfer.refusal = "refused to connect to \(ip): \(reason)"
        return CURL_SOCKET_BAD
    }
    return openOwnSocket(address, for: transfer)
}

func openOwnSocket(_ address: UnsafeMutablePointer<curl_sockaddr>, for transfer: Transfer) -> curl_socket_t {
    let socket = relay_curl_open_socket(address)
    if socket >= 0 { transfer.loop?.opened(socket) }
    return socket
}

func engineCloseSocket(_ context: UnsafeMutableRawPointer?, _ socket: curl_socket_t) -> Int32 {
    if let context { Unmanaged<TransferLoop>.fromOpaque(context).takeUnretainedValue().closing(socket) }
    return relay_close_socket(socket)
}
