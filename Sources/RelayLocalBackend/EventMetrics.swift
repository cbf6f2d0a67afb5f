import Foundation
import GRDB
public import RelayCore

/// The subscription metrics of the console's overview and of `GET /subscriptions-api/internal/v1/metrics`,
/// one row per UTC day up to today, computed over the events store (docs/metrics.md defines each):
///
/// - **Snapshots at the end of each day** (the next midnight, UTC; now for today):
///   - `activeSubscriptions`: subscriptions in a paid period: a purchase or renewal whose period
///     (`purchasedAt` to `expirationAt`) covers the instant, not ended before it (an expiration; an App
///     Store refund, which revokes access); a subscription counts once, by its latest period;
///   - `activeTrials`: the same for trial periods;
///   - `mrrUsd`: the monthly recurring revenue of the active subscriptions: each one's current period's
///     USD price, normalized to a month by the period's standard length (weeks, or whole months).
/// - **Movements during the day:** `newSubscriptions` (first paid periods: a paid initial purchase, or
///   a trial's conversion), `trialStarts`, `trialConversions`, `trialExpirations` (trials that ended
///   unconverted), `churned` (paid subscriptions whose access ended: an expiration outside a trial, not of
///   a promotional grant), `refunds` and `refundsUsd`, `grossUsd` and `netUsd` (as the revenue route counts
///   them).
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

    /// Midnight UTC of the day `time` is in.
    public static func dayStart(_ time: Int64) -> Int64 { time - ((time % day) + day) % day }

    /// What a period's price is a month of: weeks (a period shorter than 26 days, in whole weeks) × 12 / 52,
    /// else whole months (30.4375 days each, at least one). A calendar month is one month, a year twelve.
    static func months(fromPeriod milliseconds: Int64) -> Double {
        let days = Double(milliseconds) / Double(day)
        if days < 26 { return max(1, (days / 7).rounded()) * 12 / 52 }
        return max(1, (days / 30.4375).rounded())
    }

    /// The metrics of each UTC day from `since`'s day to `until`'s (exclusive) and no later than today, for
    /// the events `filter` keeps (its app, apps, store and environment; its time bounds are replaced by the
    /// days). `now` caps the last snapshot (today's is as of now).
    public func metrics(_ filter: EventFilter, since: Int64, until: Int64, now: Int64) async throws -> [MetricsDay] {
        let first = Self.dayStart(since)
        var days: [Int64] = []
        var day = first
        while day < until, day <= now, days.count < Self.maximumMetricsDays {
            days.append(day)
            day += Self.day
        }
        guard let lastDay = days.last else { return [] }
        let end = lastDay + Self.day
        var scope = filter
        scope.since = nil
        scope.until = nil
        scope.types = []
        scope.notificationId = nil
        scope.originalTransactionId = nil
        scope.appUserId = nil
        let (clause, arguments) = scope.sql(after: nil)
        // Purchases and renewals with their period, those overlapping the days; the App Store's refunds, which
        // revoke what they refund (elsewhere a refund leaves the subscription to the store's own end); and the
        // ends (expirations) that close what a subscription's period covered.
        let periods = """
            SELECT app, store, original_transaction_id AS subscription, price_usd AS usd, json_extract(payload, '$.data.transactionId') AS txn,
                json_extract(payload, '$.data.purchasedAt') AS starts, json_extract(payload, '$.data.expirationAt') AS ends,
                json_extract(payload, '$.data.periodType') AS period_type
            FROM event
            WHERE \(clause) AND type IN ('initial_purchase', 'renewal') AND ts < ?
                AND json_extract(payload, '$.data.purchasedAt') IS NOT NULL
                AND json_extract(payload, '$.data.expirationAt') > json_extract(payload, '$.data.purchasedAt')
                AND json_extract(payload, '$.data.expirationAt') > ? AND json_extract(payload, '$.data.purchasedAt') < ?
            """
        let refunds = """
            SELECT app, store, original_transaction_id AS subscription, json_extract(payload, '$.data.transactionId') AS txn, ts FROM event
            WHERE \(clause) AND store = 'apple' AND type = 'cancellation' AND json_extract(payload, '$.data.cancelReason') = 'CUSTOMER_SUPPORT' AND ts < ?
            """
        let endings = "SELECT app, store, original_transaction_id AS subscription, ts FROM event WHERE \(clause) AND type = 'expiration' AND ts < ?"
        let movements = """
            SELECT (ts - (((ts % \(Self.day)) + \(Self.day)) % \(Self.day))) AS day,
                COUNT(CASE WHEN (type = 'initial_purchase' AND COALESCE(json_extract(payload, '$.data.periodType'), '') != 'TRIAL')
                    OR (type = 'renewal' AND json_extract(payload, '$.data.isTrialConversion') = 1) THEN 1 END) AS new_subscriptions,
                COUNT(CASE WHEN type = 'initial_purchase' AND json_extract(payload, '$.data.periodType') = 'TRIAL' THEN 1 END) AS trial_starts,
                COUNT(CASE WHEN type = 'renewal' AND json_extract(payload, '$.data.isTrialConversion') = 1 THEN 1 END) AS trial_conversions,
                COUNT(CASE WHEN type = 'expiration' AND json_extract(payload, '$.data.periodType') = 'TRIAL' THEN 1 END) AS trial_expirations,
                COUNT(CASE WHEN type = 'expiration' AND store != 'promotional'
                    AND COALESCE(json_extract(payload, '$.data.periodType'), '') NOT IN ('TRIAL', 'PROMOTIONAL') THEN 1 END) AS churned,
                COUNT(CASE WHEN price_usd < 0 THEN 1 END) AS refunds,
                COALESCE(SUM(CASE WHEN price_usd < 0 THEN -price_usd END), 0) AS refunds_usd,
                COALESCE(SUM(CASE WHEN price_usd > 0 THEN price_usd END), 0) AS gross_usd,
                COALESCE(SUM(price_usd), 0) AS net_usd
            FROM event WHERE \(clause) AND ts >= ? AND ts < ?
            GROUP BY day
            """
        // Read in one transaction; the days are computed after it, holding no reader.
        let (periodRows, refundRows, endingRows, movementRows) = try await pool.read { db in
            (
                try Row.fetchAll(db, sql: periods, arguments: arguments + [end, first, end]),
                try Row.fetchAll(db, sql: refunds, arguments: arguments + [end]),
                try Row.fetchAll(db, sql: endings, arguments: arguments + [end]),
                try Row.fetchAll(db, sql: movements, arguments: arguments + [first, end])
            )
        }
        /// A subscription's key across apps and stores.
        func key(_ row: Row) -> String { "\(row["app"] as String? ?? "")\u{1F}\(row["store"] as String? ?? "")\u{1F}\(row["subscription"] as String? ?? "")" }
        var ended: [String: [Int64]] = [:]
        for row in endingRows { ended[key(row), default: []].append(row["ts"]) }
        var refunded: [String: Int64] = [:]
        for row in refundRows {
            guard let txn: String = row["txn"] else { continue }
            let id = key(row) + "\u{1F}" + txn
            refunded[id] = min(refunded[id] ?? .max, row["ts"])
        }
        struct Period {
            var usd: Double?
            var starts: Int64
            /// The period paid for, which its price is normalized by.
            var ends: Int64
            /// When it stops giving access: its end, an App Store refund, or an expiration since it began.
            var until: Int64
            var trial: Bool
        }
        var bySubscription: [String: [Period]] = [:]
        for row in periodRows {
            let subscription = key(row)
            let starts: Int64 = row["starts"]
            let ends: Int64 = row["ends"]
            var until = ends
            if let txn: String = row["txn"], let at = refunded[subscription + "\u{1F}" + txn] { until = min(until, at) }
            if let end = ended[subscription]?.filter({ $0 > starts }).min() { until = min(until, end) }
            bySubscription[subscription, default: []].append(
                Period(usd: row["usd"], starts: starts, ends: ends, until: until, trial: (row["period_type"] as String?) == "TRIAL"))
        }
        var result = days.map { MetricsDay(day: $0) }
        // Each subscription once: for each day it has a period covering the day's end, its latest such period.
        for periods in bySubscription.values {
            let sorted = periods.sorted { $0.starts < $1.starts }
            for (index, start) in days.enumerated() {
                let instant = min(start + Self.day - 1, now)
                guard let current = sorted.last(where: { $0.starts <= instant && instant < $0.until }) else { continue }
                if current.trial {
                    result[index].activeTrials += 1
                } else {
                    result[index].activeSubscriptions += 1
                    if let usd = current.usd, usd > 0 { result[index].mrrUsd += usd / Self.months(fromPeriod: current.ends - current.starts) }
                }
            }
        }
        for row in movementRows {
            let day: Int64 = row["day"]
            let index = Int((day - first) / Self.day)
            guard result.indices.contains(index) else { continue }
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
