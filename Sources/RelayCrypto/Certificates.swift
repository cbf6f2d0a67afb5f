import COpenSSL
import Foundation

/// An X.509 certificate (`X509`), owned.
public final class Certificate: @unchecked Sendable {
    let pointer: OpaquePointer

    /// Takes ownership of one reference to `pointer`.
    init(taking pointer: OpaquePointer) {
        self.pointer = pointer
    }

    deinit { X509_free(pointer) }

    /// One DER certificate; trailing bytes are refused.
    public convenience init(der: [UInt8]) throws(OpenSSLError) {
        let parsed: OpaquePointer? = der.withUnsafeBufferPointer { buffer in
            guard let start = buffer.baseAddress else { return nil }
            var cursor: UnsafePointer<UInt8>? = start
            guard let certificate = d2i_X509(nil, &cursor, buffer.count) else { return nil }
            guard cursor == start + buffer.count else {
                X509_free(certificate)
                return nil
            }
            return certificate
        }
        guard let parsed else {
            throw OpenSSLError(operation: "parse DER certificate", messages: OpenSSLError.drainQueue())
        }
        self.init(taking: parsed)
    }

    /// Every certificate in a DER file or a PEM file (one or more `CERTIFICATE` blocks).
    public static func load(contentsOf path: String) throws(OpenSSLError) -> [Certificate] {
        guard let data = FileManager.default.contents(atPath: path) else {
            throw OpenSSLError(operation: "read certificate file \(path)", messages: ["cannot read the file"])
        }
        let bytes = Array(data)
        if bytes.starts(with: Array("-----BEGIN".utf8)) || String(decoding: bytes.prefix(4096), as: UTF8.self).contains("-----BEGIN CERTIFICATE") {
            return try pem(bytes, source: path)
        }
        return [try Certificate(der: bytes)]
    }

    /// Every `CERTIFICATE` block of PEM text.
    public static func pem(_ bytes: [UInt8], source: String = "PEM") throws(OpenSSLError) -> [Certificate] {
        let certificates: [Certificate] =
            withMemoryBIO(bytes) { bio in
                var certificates: [Certificate] = []
                while let certificate = PEM_read_bio_X509(bio, nil, nil, nil) {
                    certificates.append(Certificate(taking: certificate))
                }
                return certificates
            } ?? []
        // Reading stops with a "no start line" error at the end of the input; any other error is a
        // damaged block, which must not pass unnoticed (a root silently missing from a store).
        let last = ERR_peek_last_error()
        OpenSSLError.clearQueue()
        if last != 0, ERR_GET_REASON(last) != PEM_R_NO_START_LINE {
            throw OpenSSLError(operation: "parse \(source)", messages: ["a PEM CERTIFICATE block is damaged"])
        }
        guard !certificates.isEmpty else {
            throw OpenSSLError(operation: "parse \(source)", messages: ["no PEM CERTIFICATE block"])
        }
        return certificates
    }

    /// The subject public key.
    public func publicKey() throws(OpenSSLError) -> PublicKey {
        guard let key = X509_get_pubkey(pointer) else { throw .drain("read certificate public key") }
        return PublicKey(taking: key)
    }

    /// Whether the certificate carries an extension with this dotted OID (critical or not).
    public func hasExtension(oid: String) -> Bool {
        guard let object = OBJ_txt2obj(oid, 1) else {
            OpenSSLError.clearQueue()
            return false
        }
        defer { ASN1_OBJECT_free(object) }
        return X509_get_ext_by_OBJ(pointer, object, -1) >= 0
    }

    /// Validity period, Unix seconds.
    public var validity: ClosedRange<Int64> {
        let notBefore = Self.unixTime(X509_get0_notBefore(pointer)) ?? .max
        let notAfter = Self.unixTime(X509_get0_notAfter(pointer)) ?? .min
        return notBefore <= notAfter ? notBefore...notAfter : notAfter...notAfter
    }

    /// The subject's distinguished name, one line.
    public var subject: String {
        guard let name = X509_get_subject_name(pointer), let line = X509_NAME_oneline(name, nil, 0) else { return "?" }
        defer { relay_openssl_free(line) }
        return String(cString: line)
    }

    /// The DER encoding.
    public var der: [UInt8] {
        let length = i2d_X509(pointer, nil)
        guard length > 0 else { return [] }
        var der = [UInt8](repeating: 0, count: Int(length))
        der.withUnsafeMutableBufferPointer { buffer in
            var cursor = buffer.baseAddress
            _ = i2d_X509(pointer, &cursor)
        }
        return der
    }

    /// Whether both are the same certificate (same DER).
    public func isSame(as other: Certificate) -> Bool { X509_cmp(pointer, other.pointer) == 0 }

    private static func unixTime(_ time: UnsafePointer<ASN1_TIME>?) -> Int64? {
        guard let time else { return nil }
        var parts = tm()
        guard ASN1_TIME_to_tm(time, &parts) == 1 else {
            OpenSSLError.clearQueue()
            return nil
        }
        return Int64(timegm(&parts))
    }
}

/// A set of trust anchors (`X509_STORE`), owned. Chains are built and checked by OpenSSL.
public final class TrustStore: @unchecked Sendable {
    private let store: OpaquePointer

    public init(roots: [Certificate]) throws(OpenSSLError) {
        guard let store = X509_STORE_new() else { throw .drain("create certificate store") }
        self.store = store
        for root in roots where X509_STORE_add_cert(store, root.pointer) != 1 {
            throw .drain("add root certificate \(root.subject)")
        }
    }

    deinit { X509_STORE_free(store) }

    /// Why a chain was refused.
    public enum ChainError: Error, Sendable, Equatable {
        /// A certificate of the chain is expired or not yet valid at the verification time.
        case outsideValidity(String)
        /// No chain to a trust anchor, or a certificate in it is bad.
        case untrusted(String)
    }

    /// Builds the chain `leaf` → `intermediates` → a root of this store and checks it at `time`
    /// (Unix seconds), as OpenSSL does: signatures, validity, CA constraints, path length.
    /// Returns the chain from the leaf to the root.
    public func verify(leaf: Certificate, intermediates: [Certificate], at time: Int64) -> Result<[Certificate], ChainError> {
        guard let untrusted = relay_sk_X509_new_null() else { return .failure(.untrusted("out of memory")) }
        defer { relay_sk_X509_free(untrusted) }
        // Freed before the stack it points to.
        guard let context = X509_STORE_CTX_new() else { return .failure(.untrusted(OpenSSLError.drain("create chain context").description)) }
        defer { X509_STORE_CTX_free(context) }
        for certificate in intermediates { _ = relay_sk_X509_push(untrusted, certificate.pointer) }
        guard X509_STORE_CTX_init(context, store, leaf.pointer, untrusted) == 1 else {
            return .failure(.untrusted(OpenSSLError.drain("initialize chain context").description))
        }
        X509_VERIFY_PARAM_set_time(X509_STORE_CTX_get0_param(context), time_t(time))
        // The intermediates and roots stay alive (self) for the duration of the call.
        let verified = withExtendedLifetime((intermediates, leaf)) { X509_verify_cert(context) == 1 }
        if !verified {
            let code = X509_STORE_CTX_get_error(context)
            let depth = X509_STORE_CTX_get_error_depth(context)
            OpenSSLError.clearQueue()
            let message = "\(String(cString: X509_verify_cert_error_string(Int(code)))) (certificate \(depth) of the chain)"
            switch code {
            case X509_V_ERR_CERT_HAS_EXPIRED, X509_V_ERR_CERT_NOT_YET_VALID: return .failure(.outsideValidity(message))
            default: return .failure(.untrusted(message))
            }
        }
        guard let chain = X509_STORE_CTX_get0_chain(context) else { return .failure(.untrusted("no chain")) }
        var certificates: [Certificate] = []
        for index in 0..<relay_sk_X509_num(chain) {
            guard let certificate = relay_sk_X509_value(chain, index) else { continue }
            X509_up_ref(certificate)
            certificates.append(Certificate(taking: certificate))
        }
        return .success(certificates)
    }
}
