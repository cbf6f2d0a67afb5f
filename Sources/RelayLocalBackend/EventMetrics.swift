import Foundation
import GRDB
public import RelayCore

/// The subscription metrics of the console's overview and of `GET /subscriptions-api/internal/v1/metrics`,
/// one row per UTC day, computed by SQL over the events store (docs/metrics.md defines each):
///
/// - **Snapshots at the end of each day** (the next midnight, UTC; now for today):
///   - `activeSubscriptions`: subscriptions in a paid period: a purchase or renewal whose period
///     (`purchasedAt` to `expirationAt`) covers the instant, not refunded before it, and not ended since by
///     an expiration; a subscription counts once, by its latest period;
///   - `activeTrials`: the same for trial periods;
///   - `mrrUsd`: the monthly recurring revenue of the active subscriptions: each one's last paid price in
///     USD, normalized to a month (30.4375 days) by its own period's length.
/// - **Movements during the day:** `newSubscriptions` (first paid periods: a paid initial purchase, or
///   a trial's conversion), `trialStarts`, `trialConversions`, `trialExpirations` (trials that ended
///   unconverted), `churned` (paid subscriptions whose
///   access ended: an expiration outside a trial), `refunds` and `refundsUsd`, `grossUsd` and `netUsd`
///   (as the revenue route counts them).
///
/// Events of both environments are counted unless `filter.environment` narrows them (the route defaults
/// to PRODUCTION); historical (imported) events count like live ones: they are the subscription's history.
extension EventStore {
    /// One UTC day of the metrics.
    public struct MetricsDay: Sendable, Equatable {
        /// The day's start (Unix ms, midnight UTC).
        public var day: Int64
        public var activeSubscriptions = 0
        public var activeTrials = 0
        public var mrrUsd = 0.0
        public var newSubscriptions = 0
        public var trialStarts = 0
        public var trialConversions = 0
        /// Trials that ended without converting (their expiration).
        public var trialExpirations = 0
        public var churned = 0
        public var refunds = 0
        public var refundsUsd = 0.0
        public var grossUsd = 0.0
        public var netUsd = 0.0

        public init(day: Int64) { self.day = day }

        public var json: JSON {
            [
                "day": .string(String(Timestamp.rfc3339(milliseconds: day).prefix(10))), "activeSubscriptions": .integer(Int64(activeSubscriptions)),
                "activeTrials": .integer(Int64(activeTrials)), "mrrUsd": .number(Self.cents(mrrUsd)), "newSubscriptions": .integer(Int64(newSubscriptions)),
                "trialStarts": .integer(Int64(trialStarts)), "trialConversions": .integer(Int64(trialConversions)),
                "trialExpirations": .integer(Int64(trialExpirations)), "churned": .integer(Int64(churned)),
                "refunds": .integer(Int64(refunds)), "refundsUsd": .number(Self.cents(refundsUsd)), "grossUsd": .number(Self.cents(grossUsd)),
                "netUsd": .number(Self.cents(netUsd)),
            ]
        }

        static func cents(_ value: Double) -> Double { (value * 100).rounded() / 100 }
    }

    /// The longest range the metrics route answers, in days.
    public static let maximumMetricsDays: Int64 = 400
    static let day: Int64 = 86_400_000
    /// A month, in milliseconds: 365.25 days / 12.
    static let month: Double = 30.4375 * 86_400_000

    /// The metrics of each UTC day from `since`'s day to `until`'s (exclusive), for the events `filter` keeps
    /// (its app, apps, store and environment; its time bounds are replaced by the days). `now` caps the last
    /// snapshot (today's is as of now).
    public func metrics(_ filter: EventFilter, since: Int64, until: Int64, now: Int64) async throws -> [MetricsDay] {
        let first = since - ((since % Self.day) + Self.day) % Self.day
        var days: [Int64] = []
        var day = first
        while day < until, days.count < Self.maximumMetricsDays {
            days.append(day)
            day += Self.day
        }
        guard let lastDay = days.last else { return [] }
        var scope = filter
        scope.since = nil
        scope.until = nil
        scope.types = []
        scope.notificationId = nil
        scope.originalTransactionId = nil
        scope.appUserId = nil
        let (clause, arguments) = scope.sql(after: nil)
        // Paid or trial periods that may cover a snapshot (purchases and renewals with their period), the
        // refunds that take a payment back (from their time on, its period gives nothing), and the ends
        // (expirations) that close what a subscription's period covered.
        let periods = """
            SELECT original_transaction_id AS subscription, price_usd AS usd, json_extract(payload, '$.data.transactionId') AS txn,
                json_extract(payload, '$.data.purchasedAt') AS starts, json_extract(payload, '$.data.expirationAt') AS ends,
                json_extract(payload, '$.data.periodType') AS period_type
            FROM event
            WHERE \(clause) AND type IN ('initial_purchase', 'renewal')
                AND json_extract(payload, '$.data.purchasedAt') IS NOT NULL
                AND json_extract(payload, '$.data.expirationAt') > json_extract(payload, '$.data.purchasedAt')
                -- Only periods that overlap the days asked for.
                AND json_extract(payload, '$.data.expirationAt') > ? AND json_extract(payload, '$.data.purchasedAt') < ?
            """
        let refunds = """
            SELECT original_transaction_id AS subscription, json_extract(payload, '$.data.transactionId') AS txn, ts FROM event
            WHERE \(clause) AND type = 'cancellation' AND json_extract(payload, '$.data.cancelReason') = 'CUSTOMER_SUPPORT'
            """
        let endings = "SELECT original_transaction_id AS subscription, ts FROM event WHERE \(clause) AND type = 'expiration'"
        let snapshotDays = days
        return try await pool.read { db in
            var result: [MetricsDay] = []
            var ended: [String: [Int64]] = [:]
            for row in try Row.fetchAll(db, sql: endings, arguments: arguments) {
                ended[row["subscription"], default: []].append(row["ts"])
            }
            var refunded: [String: Int64] = [:]
            for row in try Row.fetchAll(db, sql: refunds, arguments: arguments) {
                guard let subscription: String = row["subscription"], let txn: String = row["txn"] else { continue }
                let key = subscription + "\u{1F}" + txn
                refunded[key] = min(refunded[key] ?? .max, row["ts"])
            }
            struct Period {
                var subscription: String
                var usd: Double?
                var starts: Int64
                /// The period paid for, which its price is normalized by.
                var ends: Int64
                /// When it stops giving access: its end, or its refund.
                var until: Int64
                var trial: Bool
            }
            let all = try Row.fetchAll(db, sql: periods, arguments: arguments + [first, lastDay + Self.day]).map { row in
                let subscription: String = row["subscription"]
                let ends: Int64 = row["ends"]
                var until = ends
                // A refunded payment's period gives nothing from the refund on.
                if let txn: String = row["txn"], let at = refunded[subscription + "\u{1F}" + txn] { until = min(ends, at) }
                return Period(
                    subscription: subscription, usd: row["usd"], starts: row["starts"], ends: ends, until: until, trial: (row["period_type"] as String?) == "TRIAL")
            }
            // Snapshots: at each day's end (now for today), the latest period of each subscription that covers it.
            for start in snapshotDays {
                var metrics = MetricsDay(day: start)
                let instant = min(start + Self.day - 1, now)
                var latest: [String: Period] = [:]
                for period in all where period.starts <= instant && instant < period.until {
                    // Ended since that period began (an expiration, a revocation): no longer active.
                    if ended[period.subscription]?.contains(where: { $0 > period.starts && $0 <= instant }) == true { continue }
                    if let known = latest[period.subscription], known.starts >= period.starts { continue }
                    latest[period.subscription] = period
                }
                for period in latest.values {
                    if period.trial {
                        metrics.activeTrials += 1
                    } else {
                        metrics.activeSubscriptions += 1
                        if let usd = period.usd, usd > 0 { metrics.mrrUsd += usd * Self.month / Double(period.ends - period.starts) }
                    }
                }
                result.append(metrics)
            }
            // Movements: each day's events.
            let movements = """
                SELECT (ts - (ts % \(Self.day))) AS day,
                    COUNT(CASE WHEN (type = 'initial_purchase' AND COALESCE(json_extract(payload, '$.data.periodType'), '') != 'TRIAL')
                        OR (type = 'renewal' AND json_extract(payload, '$.data.isTrialConversion') = 1) THEN 1 END) AS new_subscriptions,
                    COUNT(CASE WHEN type = 'initial_purchase' AND json_extract(payload, '$.data.periodType') = 'TRIAL' THEN 1 END) AS trial_starts,
                    COUNT(CASE WHEN type = 'renewal' AND json_extract(payload, '$.data.isTrialConversion') = 1 THEN 1 END) AS trial_conversions,
                    COUNT(CASE WHEN type = 'expiration' AND json_extract(payload, '$.data.periodType') = 'TRIAL' THEN 1 END) AS trial_expirations,
                    COUNT(CASE WHEN type = 'expiration' AND COALESCE(json_extract(payload, '$.data.periodType'), '') != 'TRIAL' THEN 1 END) AS churned,
                    COUNT(CASE WHEN price_usd < 0 THEN 1 END) AS refunds,
                    COALESCE(SUM(CASE WHEN price_usd < 0 THEN -price_usd END), 0) AS refunds_usd,
                    COALESCE(SUM(CASE WHEN price_usd > 0 THEN price_usd END), 0) AS gross_usd,
                    COALESCE(SUM(price_usd), 0) AS net_usd
                FROM event WHERE \(clause) AND ts >= ? AND ts < ?
                GROUP BY day
                """
            let rows = try Row.fetchAll(db, sql: movements, arguments: arguments + [first, lastDay + Self.day])
            for row in rows {
                let day: Int64 = row["day"]
                guard let index = result.firstIndex(where: { $0.day == day }) else { continue }
                result[index].newSubscriptions = row["new_subscriptions"]
                result[index].trialStarts = row["trial_starts"]
                result[index].trialConversions = row["trial_conversions"]
                result[index].trialExpirations = row["trial_expirations"]
                result[index].churned = row["churned"]
                result[index].refunds = row["refunds"]
                result[index].refundsUsd = row["refunds_usd"]
                result[index].grossUsd = row["gross_usd"]
                result[index].netUsd = row["net_usd"]
            }
            return result
        }
    }
}
