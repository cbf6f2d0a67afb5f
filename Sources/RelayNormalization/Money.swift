public import Foundation
public import RelayConfig
import RelayCore

/// An amount in a store's currency, exact (decimal, never binary floating point).
struct Amount: Sendable, Equatable {
    var value: Decimal
    /// ISO 4217, upper case.
    var currency: String

    init(_ value: Decimal, _ currency: String) {
        self.value = value
        self.currency = currency.uppercased()
    }

    /// Apple reports prices in milliunits of the currency (`9990` is 9.99).
    static func milliunits(_ value: Int64, _ currency: String) -> Amount {
        Amount(Decimal.scaled(value, places: 3), currency)
    }

    /// Google's `Money` (`{"currencyCode", "units": "9", "nanos": 990000000}`).
    static func googleMoney(_ money: JSON?) -> Amount? {
        guard let money, let currency = money["currencyCode"]?.stringValue else { return nil }
        let units = money["units"]?.stringValue.flatMap { Int64($0) } ?? money["units"]?.int64Value ?? 0
        let nanos = money["nanos"]?.int64Value ?? 0
        return Amount(Decimal(units) + Decimal.scaled(nanos, places: 9), currency)
    }

    /// Stripe amounts are integers in the currency's minor unit, with Stripe's own list of zero- and
    /// three-decimal currencies (https://docs.stripe.com/currencies#zero-decimal).
    static func stripeMinorUnits(_ value: Decimal, _ currency: String) -> Amount {
        let code = currency.uppercased()
        let exponent = Self.stripeZeroDecimal.contains(code) ? 0 : Self.threeDecimal.contains(code) ? 3 : 2
        return Amount(Decimal(sign: value.sign, exponent: -exponent, significand: value.magnitude), code)
    }

    /// Paddle amounts are strings in the currency's lowest denomination (ISO 4217 minor units).
    static func paddleMinorUnits(_ text: String?, _ currency: String?) -> Amount? {
        guard let text, let currency, let value = Int64(text) else { return nil }
        let code = currency.uppercased()
        let exponent = Self.isoZeroDecimal.contains(code) ? 0 : Self.threeDecimal.contains(code) ? 3 : 2
        return Amount(Decimal.scaled(value, places: exponent), code)
    }

    static let stripeZeroDecimal: Set<String> = [
        "BIF", "CLP", "DJF", "GNF", "JPY", "KMF", "KRW", "MGA", "PYG", "RWF", "UGX", "VND", "VUV", "XAF", "XOF", "XPF",
    ]
    static let isoZeroDecimal: Set<String> = [
        "BIF", "CLP", "DJF", "GNF", "ISK", "JPY", "KMF", "KRW", "PYG", "RWF", "UGX", "UYI", "VND", "VUV", "XAF", "XOF", "XPF",
    ]
    static let threeDecimal: Set<String> = ["BHD", "IQD", "JOD", "KWD", "LYD", "OMR", "TND"]

    var negated: Amount { Amount(-value, currency) }
}

/// `exchange-rates.json` (docs/configuration.md): `{"base": "USD", "rates": {"EUR": 0.92, ...}}`, units of each
/// currency per one unit of `base`.
public struct ExchangeRates: Sendable {
    public var base: String
    public var rates: [String: Decimal]

    public init(base: String = "USD", rates: [String: Decimal] = [:]) {
        self.base = base.uppercased()
        self.rates = Dictionary(rates.map { ($0.key.uppercased(), $0.value) }, uniquingKeysWith: { first, _ in first })
    }

    /// Reads the configured file; a missing path means only USD converts.
    public static func load(path: String?) throws(ConfigurationError) -> ExchangeRates {
        guard let path else { return ExchangeRates() }
        let document: JSON
        do {
            document = try JSON.parse(Array(try Data(contentsOf: URL(fileURLWithPath: path))))
        } catch {
            throw ConfigurationError(key: "money.exchangeRates", message: "cannot read \(path) as JSON: \(error)")
        }
        guard let base = document["base"]?.stringValue, base.count == 3 else {
            throw ConfigurationError(key: "money.exchangeRates", message: "\(path) needs \"base\": a three-letter currency code such as \"USD\"")
        }
        guard let table = document["rates"]?.objectValue else {
            throw ConfigurationError(key: "money.exchangeRates", message: "\(path) needs \"rates\": {\"EUR\": 0.92, ...}")
        }
        var rates: [String: Decimal] = [:]
        for (code, value) in table {
            // Parse the number's text exactly, not through a binary double.
            guard let number = value.doubleValue, number > 0, number.isFinite, let decimal = Decimal(string: "\(number)") else {
                throw ConfigurationError(key: "money.exchangeRates", message: "\(path): the rate of \(code) must be a positive number")
            }
            rates[code] = decimal
        }
        return ExchangeRates(base: base, rates: rates)
    }

    /// US dollars per one unit of `currency`, or nil when the table cannot say.
    public func usdPerUnit(of currency: String) -> Decimal? {
        let code = currency.uppercased()
        if code == "USD" { return 1 }
        let perBase: (String) -> Decimal? = { $0 == base ? 1 : rates[$0] }
        guard let currencyPerBase = perBase(code), let usdPerBase = perBase("USD"), currencyPerBase > 0 else { return nil }
        return usdPerBase / currencyPerBase
    }
}

/// How one event's money fields come out (docs/contracts.md, the standardized event): the purchased amount as given, USD values
/// converted with the configured rate (null when there is none, never 0), the store's commission.
struct MoneyFields: Equatable {
    var priceInPurchasedCurrency: Decimal?
    var currencyCode: String?
    var price: Decimal?
    var proceeds: Decimal?
    var exchangeRate: Decimal?
    var taxPercentage: Decimal?
    var commissionPercentage: Decimal
    var takehomePercentage: Decimal
    var isSmallBusiness: Bool
    /// A currency had no configured rate.
    var missingRate: String?

    /// `amount` is what the customer paid (tax included), negative for refunds. Proceeds are the price
    /// without tax (when known) minus the store's commission, or what the store says the seller earns
    /// (`earnings`: Paddle's total less tax and its fee), in which case the commission is what that leaves.
    /// A zero amount (a free trial) is 0 USD whatever its currency, with or without a rate.
    static func compute(
        amount: Amount?, earnings: Amount? = nil, taxPercentage: Decimal?, storeName: String, money: RelayConfiguration.Money,
        rates: ExchangeRates
    ) -> MoneyFields {
        let small = money.smallBusiness && storeName == "APP_STORE"
        let commissionKey = small ? "APP_STORE_SMALL_BUSINESS" : storeName
        let commission = Decimal(string: "\(money.commission[commissionKey] ?? 0)") ?? 0
        var fields = MoneyFields(
            priceInPurchasedCurrency: amount.map { round($0.value, 6) }, currencyCode: amount?.currency, price: nil, proceeds: nil,
            exchangeRate: nil, taxPercentage: taxPercentage.map { round($0, 4) }, commissionPercentage: commission,
            takehomePercentage: 1 - commission, isSmallBusiness: small, missingRate: nil)
        guard let amount else { return fields }
        if amount.currency.isEmpty { fields.currencyCode = nil }  // a free trial whose currency the store does not say
        guard let rate = rates.usdPerUnit(of: amount.currency) else {
            if amount.value == 0 {
                fields.price = 0
                fields.proceeds = 0
            } else {
                fields.missingRate = amount.currency
            }
            return fields
        }
        // × 1 (USD, or the base's own currency) is the value itself: Decimal arithmetic costs about a microsecond
        // an operation, and the worker does this for every event that moves money.
        let usd = rate == 1 ? amount.value : amount.value * rate
        let net = taxPercentage.map { usd / (1 + $0) } ?? usd
        fields.exchangeRate = round(rate, 6)
        fields.price = round(usd, 2)
        fields.proceeds = round(net * (1 - commission), 2)
        if let earnings, earnings.currency == amount.currency {
            let earned = earnings.value * rate
            fields.proceeds = round(earned, 2)
            if net != 0 {
                let takehome = round(earned / net, 4)
                fields.takehomePercentage = takehome
                fields.commissionPercentage = 1 - takehome
            }
        }
        return fields
    }

    static func round(_ value: Decimal, _ scale: Int) -> Decimal {
        // No more decimals than `scale`: rounding leaves it as it is (and NSDecimalRound costs a microsecond).
        if value.exponent >= -scale { return value }
        var input = value
        var output = Decimal()
        NSDecimalRound(&output, &input, scale, .plain)
        return output
    }
}

extension Decimal {
    /// `value` / 10^`places`, exactly, made as a significand and an exponent without its trailing zeros (as a
    /// division leaves it): `scaled(9990, places: 3)` is 9.99. A Decimal division costs about 4 µs.
    static func scaled(_ value: Int64, places: Int) -> Decimal {
        // The sign apart from a positive significand: Foundations before swift-foundation took the sign from
        // `sign` alone.
        var magnitude = value.magnitude
        var places = places
        while places > 0, magnitude != 0, magnitude % 10 == 0 {
            magnitude /= 10
            places -= 1
        }
        return Decimal(sign: value < 0 ? .minus : .plus, exponent: -places, significand: Decimal(magnitude))
    }

    /// The JSON number for this decimal: the double nearest to its decimal text (3.49 stays 3.49;
    /// `NSDecimalNumber.doubleValue` can land one ulp off on Linux and print 3.4899999999999998).
    var number: Double { Double(description) ?? NSDecimalNumber(decimal: self).doubleValue }
}
