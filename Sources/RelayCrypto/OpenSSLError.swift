import COpenSSL

/// A failure inside OpenSSL, with the library's error queue as text. Never carries key material.
public struct OpenSSLError: Error, Sendable, CustomStringConvertible {
    /// What the relay was doing ("parse certificate", "load private key").
    public var operation: String
    /// OpenSSL's own messages, oldest first.
    public var messages: [String]

    public var description: String {
        messages.isEmpty ? "OpenSSL: \(operation) failed" : "OpenSSL: \(operation) failed: \(messages.joined(separator: "; "))"
    }

    /// Takes (and so clears) this thread's OpenSSL error queue.
    static func drain(_ operation: String) -> OpenSSLError {
        OpenSSLError(operation: operation, messages: drainQueue())
    }

    static func drainQueue() -> [String] {
        var messages: [String] = []
        while true {
            let code = ERR_get_error()
            if code == 0 { break }
            var buffer = [CChar](repeating: 0, count: 256)
            ERR_error_string_n(code, &buffer, buffer.count)
            let text = buffer.withUnsafeBufferPointer { String(cString: $0.baseAddress!) }
            if messages.count < 8 { messages.append(text) }
        }
        return messages
    }

    /// Forgets errors a failed check left behind, so they never surface in a later, unrelated call.
    static func clearQueue() {
        ERR_clear_error()
    }
}
