import ArgumentParser
import Foundation
import RelayApp
import RelayBackend
import RelayCore
import RelayHistory

/// `revenue-relay grant`: a promotional entitlement for a user, through the backend's grants route.
struct Grant: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Grant a user a promotional entitlement until a time, for a duration, or for life.",
        discussion: """
            Calls POST /subscriptions-api/internal/v1/users/{user}/grants on the backend with backend.apiKey. The grant \
            shows in the user's customer info with store PROMOTIONAL and sends non_renewing_purchase (price 0) and \
            subscription_status_did_change; when it ends or is revoked, expiration. Prints the grant as JSON, with its \
            grantId for `revenue-relay revoke`.
            """)

    @OptionGroup var backend: BackendOptions

    @Option(help: "The app key (apps[].key) the grant is for.")
    var app: String

    @Option(name: [.customLong("user"), .customLong("app-user-id")], help: "The app user id (an alias or a device id stands for its user).")
    var user: String

    @Option(help: "The entitlement granted (pro).")
    var entitlement: String

    @Option(name: .customLong("expires-at"), help: "When it ends: an RFC 3339 time (2027-01-01T00:00:00Z), a date, or Unix milliseconds.")
    var expiresAt: String?

    @Option(help: "How long it lasts from now: an ISO 8601 duration (P1M, P7D, PT12H).")
    var duration: String?

    @Flag(help: "It never ends (until revoked).")
    var lifetime = false

    @Option(help: "Why it was granted, kept with it (at most 500 characters).")
    var reason: String?

    func validate() throws {
        let given = [expiresAt != nil, duration != nil, lifetime].filter { $0 }.count
        guard given == 1 else { throw ValidationError("give exactly one of --expires-at, --duration or --lifetime") }
        if let expiresAt, Timestamp.milliseconds(dateOrTime: expiresAt, unixMilliseconds: true) == nil {
            throw ValidationError("--expires-at must be an RFC 3339 time, a date (2027-01-01) or Unix milliseconds")
        }
    }

    func run() async throws {
        bootstrapLogging(defaultLevel: .warning)
        let reader = try backend.reader()
        var body: [String: JSON] = ["app": .string(app), "entitlement": .string(entitlement)]
        if let expiresAt, let time = Timestamp.milliseconds(dateOrTime: expiresAt, unixMilliseconds: true) { body["expiresAt"] = .integer(time) }
        if let duration { body["duration"] = .string(duration) }
        if lifetime { body["lifetime"] = true }
        if let reason { body["reason"] = .string(reason) }
        let answer = try await reading(reader) { (client) async throws(BackendError) in try await client.grant(appUserId: user, .object(body)) }
        printLine(answer.text)
    }
}

/// `revenue-relay revoke`: ends a promotional grant now.
struct Revoke: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Revoke a promotional grant at once.",
        discussion: """
            Calls DELETE /subscriptions-api/internal/v1/users/{user}/grants/{grantId}: the user gets \
            subscription_status_did_change and expiration (DEVELOPER_INITIATED). Revoking an ended grant changes nothing. \
            Exit 65 when the user has no such grant.
            """)

    @OptionGroup var backend: BackendOptions

    @Option(name: [.customLong("user"), .customLong("app-user-id")], help: "The app user id the grant was made for.")
    var user: String

    @Option(name: .customLong("grant-id"), help: "The grant's id (grantId, as `grant` printed it).")
    var grantId: String

    func run() async throws {
        bootstrapLogging(defaultLevel: .warning)
        let reader = try backend.reader()
        do {
            printLine(try await reader.client.revokeGrant(appUserId: user, grantId: grantId).text)
        } catch where error.kind == .notFound {
            FileHandle.standardError.write(Data("revenue-relay: \(error.message)\n".utf8))
            throw Exit.rejected
        } catch {
            let failure = CommandFailure(error, backendURL: reader.url)
            FileHandle.standardError.write(Data("revenue-relay: \(failure)\n".utf8))
            throw ExitCode(failure.exitCode)
        }
    }
}
