import Foundation
import RelayConfig
import RelayCore
@testable import RelayNormalization
import RelayTestSupport
import Testing

@Suite struct MoneyTests {
    let rates = ExchangeRates(base: "USD", rates: ["EUR": Decimal(string: "0.92")!, "JPY": 150])
    let money = RelayConfiguration.Money()

    @Test func storeUnitsBecomeExactDecimals() {
        #expect(Amount.milliunits(9990, "usd") == Amount(Decimal(string: "9.99")!, "USD"))
        #expect(Amount.googleMoney(["currencyCode": "EUR", "units": "4", "nanos": 990_000_000])?.value == Decimal(string: "4.99")!)
        #expect(Amount.stripeMinorUnits(999, "usd").value == Decimal(string: "9.99")!)
        #expect(Amount.stripeMinorUnits(1500, "jpy").value == 1500)  // zero-decimal
        #expect(Amount.stripeMinorUnits(12345, "kwd").value == Decimal(string: "12.345")!)  // three-decimal
        #expect(Amount.paddleMinorUnits("999", "USD")?.value == Decimal(string: "9.99")!)
        #expect(Amount.paddleMinorUnits("1500", "JPY")?.value == 1500)
        #expect(Amount.paddleMinorUnits("9.99", "USD") == nil)
    }

    /// The store units' divisions by a power of ten are made by moving the exponent, and rounding skips what has
    /// no decimals to round: each must give the very number (and the same JSON) the arithmetic gives.
    @Test func scalingAndRoundingWithoutArithmeticGiveWhatTheArithmeticGives() {
        var values: [Int64] = [0, 1, -1, 9, 10, 990, 9990, -9990, 10_000, 1_000_000_000, 123_456_789_012, .max, .min + 1]
        var state: UInt64 = 0x9E37_79B9_7F4A_7C15
        for _ in 0..<400 {
            state = state &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
            // Magnitudes from one digit to eighteen, some with trailing zeros, both signs.
            let digits = Int(state >> 59) % 18 + 1
            var value = Int64(bitPattern: state >> 8) % Int64(pow(10.0, Double(digits)))
            if state & 0x30 == 0 { value = value / 1000 * 1000 }
            values.append(state & 0x40 == 0 ? value : -value)
        }
        #expect(values.contains { $0 < -1_000 } && values.contains { $0 > 1_000 })
        for value in values {
            // Stripe's amounts arrive as a Decimal: scaled by its own exponent the same way.
            for (currency, power) in [("USD", Decimal(100)), ("JPY", Decimal(1)), ("KWD", Decimal(1000))] {
                let stripe = Amount.stripeMinorUnits(Decimal(value), currency).value
                #expect(stripe == Decimal(value) / power && stripe.number == (Decimal(value) / power).number, "\(value) \(currency)")
            }
            for places in 0...9 {
                var power = Decimal(1)
                for _ in 0..<places { power *= 10 }
                let divided = Decimal(value) / power
                let scaled = Decimal.scaled(value, places: places)
                #expect(scaled == divided, "\(value) / 10^\(places)")
                #expect(scaled.description == divided.description && scaled.number == divided.number, "\(value) / 10^\(places)")
                #expect(scaled.sign == divided.sign || divided.isZero, "\(value) / 10^\(places)")
                for scale in [2, 4, 6] {
                    var input = scaled
                    var rounded = Decimal()
                    NSDecimalRound(&rounded, &input, scale, .plain)
                    #expect(MoneyFields.round(scaled, scale) == rounded, "\(scaled) to \(scale)")
                    #expect(MoneyFields.round(scaled, scale).number == rounded.number, "\(scaled) to \(scale)")
                }
            }
        }
    }

    @Test func usdFieldsUseTheConfiguredRateAndTheStoresCommission() {
        let fields = MoneyFields.compute(
            amount: Amount(Decimal(string: "9.99")!, "EUR"), taxPercentage: nil, storeName: "APP_STORE", money: money, rates: rates)
        #expect(fields.priceInPurchasedCurrency == Decimal(string: "9.99")!)
        #expect(fields.currencyCode == "EUR")
        #expect(fields.price == Decimal(string: "10.86")!)  // 9.99 / 0.92 = 10.8587
        #expect(fields.proceeds == Decimal(string: "7.6")!)  // × 0.7
        #expect(fields.exchangeRate == Decimal(string: "1.086957")!)
        #expect(fields.commissionPercentage == Decimal(string: "0.3")!)
        #expect(fields.missingRate == nil)
    }

    /// The configuration holds units of each currency per USD (EUR 0.92); an event's `exchangeRate` is the
    /// inverse, USD per unit of the purchased currency, so price = priceInPurchasedCurrency × exchangeRate.
    @Test func exchangeRateIsUSDPerUnitOfThePurchasedCurrency() throws {
        for (amount, currency) in [("9.99", "EUR"), ("1500", "JPY"), ("-4.99", "EUR"), ("0.99", "USD")] {
            let fields = MoneyFields.compute(
                amount: Amount(Decimal(string: amount)!, currency), taxPercentage: nil, storeName: "PLAY_STORE", money: money, rates: rates)
            let rate = try #require(fields.exchangeRate)
            let price = try #require(fields.price)
            let paid = try #require(fields.priceInPurchasedCurrency)
            #expect(MoneyFields.round(paid * rate, 2) == price, "\(amount) \(currency)")
        }
        // Concrete values: 150 JPY per USD is 1/150 USD per JPY.
        let yen = MoneyFields.compute(amount: Amount(1500, "JPY"), taxPercentage: nil, storeName: "STRIPE", money: money, rates: rates)
        #expect(yen.price == 10)
        #expect(yen.exchangeRate == Decimal(string: "0.006667")!)
    }

    @Test func aFreeAmountIsZeroUSDInAnyCurrencyAndEarningsSetProceeds() {
        let trial = MoneyFields.compute(amount: Amount(0, "INR"), taxPercentage: nil, storeName: "PLAY_STORE", money: money, rates: rates)
        #expect(trial.price == 0)
        #expect(trial.proceeds == 0)
        #expect(trial.exchangeRate == nil)
        #expect(trial.currencyCode == "INR")
        #expect(trial.missingRate == nil)
        let unknownCurrency = MoneyFields.compute(amount: Amount(0, ""), taxPercentage: nil, storeName: "PLAY_STORE", money: money, rates: rates)
        #expect(unknownCurrency.price == 0)
        #expect(unknownCurrency.currencyCode == nil)
        // Paddle's earnings (total less tax and fee) are the proceeds; the commission is what they leave.
        let earned = MoneyFields.compute(
            amount: Amount(Decimal(string: "23.79")!, "EUR"), earnings: Amount(Decimal(string: "18.30")!, "EUR"), taxPercentage: Decimal(string: "3.80")! / Decimal(string: "19.99")!,
            storeName: "PADDLE", money: money, rates: rates)
        #expect(earned.proceeds == Decimal(string: "19.89")!)  // 18.30 EUR / 0.92
        #expect(earned.takehomePercentage == Decimal(string: "0.9155")!)  // 18.30 of the 19.99 without tax
        #expect(earned.commissionPercentage == Decimal(string: "0.0845")!)
    }

    @Test func aCurrencyWithoutARateLeavesTheUSDFieldsNullNeverZero() {
        let fields = MoneyFields.compute(amount: Amount(5, "CHF"), taxPercentage: nil, storeName: "PLAY_STORE", money: money, rates: rates)
        #expect(fields.price == nil)
        #expect(fields.proceeds == nil)
        #expect(fields.exchangeRate == nil)
        #expect(fields.priceInPurchasedCurrency == 5)
        #expect(fields.missingRate == "CHF")
    }

    @Test func refundsAreNegativeAndTaxComesOutOfProceeds() {
        let refund = MoneyFields.compute(
            amount: Amount(Decimal(string: "-9.99")!, "USD"), taxPercentage: nil, storeName: "APP_STORE", money: money, rates: rates)
        #expect(refund.price == Decimal(string: "-9.99")!)
        #expect(refund.proceeds == Decimal(string: "-6.99")!)
        let taxed = MoneyFields.compute(
            amount: Amount(Decimal(string: "11.90")!, "USD"), taxPercentage: Decimal(string: "0.19")!, storeName: "PADDLE", money: money,
            rates: rates)
        #expect(taxed.price == Decimal(string: "11.9")!)
        #expect(taxed.proceeds == Decimal(string: "9.5")!)  // 10.00 without tax, less Paddle's 5 %
        #expect(taxed.taxPercentage == Decimal(string: "0.19")!)
    }

    @Test func smallBusinessUsesItsCommissionOnTheAppStoreOnly() {
        var small = money
        small.smallBusiness = true
        let apple = MoneyFields.compute(amount: Amount(10, "USD"), taxPercentage: nil, storeName: "APP_STORE", money: small, rates: rates)
        #expect(apple.commissionPercentage == Decimal(string: "0.15")!)
        #expect(apple.isSmallBusiness)
        #expect(apple.proceeds == Decimal(string: "8.5")!)
        let google = MoneyFields.compute(amount: Amount(10, "USD"), taxPercentage: nil, storeName: "PLAY_STORE", money: small, rates: rates)
        #expect(!google.isSmallBusiness)
        #expect(google.commissionPercentage == Decimal(string: "0.15")!)
    }

    @Test func ratesFileAnyBaseAndClearErrors() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent(uniqueName("rates"))
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let eurBase = directory.appendingPathComponent("eur.json")
        try Data(#"{"base": "EUR", "rates": {"USD": 1.25, "GBP": 0.85}}"#.utf8).write(to: eurBase)
        let rates = try ExchangeRates.load(path: eurBase.path)
        #expect(rates.usdPerUnit(of: "EUR") == Decimal(string: "1.25")!)
        #expect(rates.usdPerUnit(of: "USD") == 1)
        #expect(rates.usdPerUnit(of: "SEK") == nil)
        let bad = directory.appendingPathComponent("bad.json")
        try Data(#"{"base": "USD", "rates": {"EUR": 0}}"#.utf8).write(to: bad)
        #expect(throws: ConfigurationError.self) { try ExchangeRates.load(path: bad.path) }
        try Data(#"{"rates": {}}"#.utf8).write(to: bad)
        #expect(throws: ConfigurationError.self) { try ExchangeRates.load(path: bad.path) }
        #expect(ExchangeRates().usdPerUnit(of: "usd") == 1)
    }

    @Test func rfc3339TimestampsAsUnixMilliseconds() {
        #expect(Timestamp.milliseconds("2030-01-01T00:00:00Z") == 1_893_456_000_000)
        #expect(Timestamp.milliseconds("2030-01-01T00:00:00.123456Z") == 1_893_456_000_123)
        #expect(Timestamp.milliseconds("2030-01-01T00:00:00.5Z") == 1_893_456_000_500)
        #expect(Timestamp.milliseconds("2030-01-01T02:00:00+02:00") == 1_893_456_000_000)
        #expect(Timestamp.milliseconds("1969-12-31T23:59:59Z") == -1000)
        #expect(Timestamp.milliseconds("2030-02-30") == nil)
        #expect(Timestamp.milliseconds("2030-01-01T00:00:00") == nil)
        #expect(Timestamp.milliseconds("2030-13-01T00:00:00Z") == nil)
        #expect(Timestamp.milliseconds("2030-02-30T00:00:00Z") == nil)
        #expect(Timestamp.milliseconds("2030-04-31T00:00:00Z") == nil)
        #expect(Timestamp.milliseconds("2028-02-29T00:00:00Z") == 1_835_395_200_000)
        #expect(Timestamp.milliseconds("2100-02-29T00:00:00Z") == nil)
        #expect(Timestamp.milliseconds("2030-01-01T00:00:00.Z") == nil)
    }

    /// What the command line, the events route and the configuration take for a time.
    @Test func datesTimesAndUnixMillisecondsAsTyped() {
        #expect(Timestamp.milliseconds(dateOrTime: "2030-01-01") == 1_893_456_000_000)
        #expect(Timestamp.milliseconds(dateOrTime: "2030-01-01T02:00:00+02:00") == 1_893_456_000_000)
        #expect(Timestamp.milliseconds(dateOrTime: "1893456000000") == nil, "Unix milliseconds only when asked for")
        #expect(Timestamp.milliseconds(dateOrTime: "1893456000000", unixMilliseconds: true) == 1_893_456_000_000)
        #expect(Timestamp.milliseconds(dateOrTime: "2030-02-30") == nil)
        #expect(Timestamp.milliseconds(dateOrTime: "yesterday", unixMilliseconds: true) == nil)
    }

    @Test func storefrontsBecomeAlpha2() {
        #expect(CountryCodes.alpha2("USA") == "US")
        #expect(CountryCodes.alpha2("DEU") == "DE")
        #expect(CountryCodes.alpha2("de") == "DE")
        #expect(CountryCodes.alpha2("XXX") == nil)
        #expect(CountryCodes.alpha2(nil) == nil)
    }
}
