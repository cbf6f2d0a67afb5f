import Foundation
import RelayCore

/// HTML for the console, built on the server: every value escaped, no script, no external asset. The
/// charts are SVG drawn here from the same numbers the routes answer (docs/console.md says why).
enum HTML {
    /// Text for an element or an attribute value.
    static func escape(_ text: String) -> String {
        var out = ""
        out.reserveCapacity(text.utf8.count)
        for character in text.unicodeScalars {
            switch character {
            case "&": out += "&amp;"
            case "<": out += "&lt;"
            case ">": out += "&gt;"
            case "\"": out += "&quot;"
            case "'": out += "&#39;"
            default: out.unicodeScalars.append(character)
            }
        }
        return out
    }

    /// A query string's value (every byte but ASCII's unreserved characters percent-encoded).
    static func query(_ text: String) -> String { PercentEncoding.encode(text) }

    static func table(_ headers: [String], _ rows: [[String]], empty: String = "Nothing yet.") -> String {
        guard !rows.isEmpty else { return "<p class=\"muted\">\(escape(empty))</p>" }
        let head = headers.map { "<th>\(escape($0))</th>" }.joined()
        // Cells are given as HTML (callers escape text): some hold links, forms or badges.
        let body = rows.map { "<tr>" + $0.map { "<td>\($0)</td>" }.joined() + "</tr>" }.joined(separator: "\n")
        return "<div class=\"scroll\"><table><thead><tr>\(head)</tr></thead><tbody>\n\(body)\n</tbody></table></div>"
    }

    static func money(_ value: Double) -> String {
        let formatter = NumberFormatter()
        formatter.numberStyle = .decimal
        formatter.minimumFractionDigits = 2
        formatter.maximumFractionDigits = 2
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.usesGroupingSeparator = true
        formatter.groupingSeparator = ","
        return "$" + (formatter.string(from: NSNumber(value: value)) ?? String(format: "%.2f", value))
    }

    static func percent(_ value: Double?) -> String {
        guard let value, value.isFinite else { return "–" }
        return String(format: "%.1f%%", value * 100)
    }

    static func time(_ milliseconds: Int64?) -> String {
        guard let milliseconds else { return "–" }
        let text = Timestamp.rfc3339(milliseconds: milliseconds)
        return escape(String(text.prefix(19)).replacingOccurrences(of: "T", with: " ")) + " UTC"
    }
}

/// A chart's series: a name, a colour, one value per label.
struct ChartSeries: Sendable {
    var name: String
    var color: String
    var values: [Double]
}

/// Line and bar charts as inline SVG, scaled to their box (`viewBox`), so they fit a phone and a laptop.
enum SVGChart {
    static let width = 640.0
    static let height = 220.0
    static let left = 56.0
    static let bottom = 28.0
    static let top = 12.0
    static let right = 12.0

    /// `bars`: bars side by side per label, else lines. `format` prints axis values.
    /// - Parameter wholeNumbers: counts: the axis steps by at least 1.
    static func render(
        title: String, id: String, labels: [String], series: [ChartSeries], bars: Bool, wholeNumbers: Bool = false, format: (Double) -> String
    ) -> String {
        let all = series.flatMap(\.values)
        // Four steps of a round size: the axis' labels are the values their lines stand at.
        let lowest = min(all.min() ?? 0, 0)
        let tick = max(wholeNumbers ? 1 : 0, niceCeiling((max(all.max() ?? 0, 0) - lowest) / 4))
        let minimum = lowest < 0 ? -tick * (-lowest / tick).rounded(.up) : 0
        let maximum = minimum + tick * 4 < (all.max() ?? 0) ? minimum + tick * 5 : minimum + tick * 4
        let span = max(maximum - minimum, 1e-9)
        let plotWidth = width - left - right
        let plotHeight = height - top - bottom
        func y(_ value: Double) -> Double { top + plotHeight * (1 - (value - minimum) / span) }
        let count = max(labels.count, 1)
        let step = plotWidth / Double(count)
        var svg = """
            <figure class="chart" id="\(HTML.escape(id))"><figcaption>\(HTML.escape(title))</figcaption>
            <svg viewBox="0 0 \(Int(width)) \(Int(height))" role="img" aria-label="\(HTML.escape(title))" preserveAspectRatio="xMidYMid meet">
            """
        // Grid and axis values: four steps.
        let steps = Int((span / tick).rounded())
        for index in 0...steps {
            let value = minimum + tick * Double(index)
            let lineY = y(value)
            svg += "<line x1=\"\(left)\" x2=\"\(width - right)\" y1=\"\(round(lineY))\" y2=\"\(round(lineY))\" class=\"grid\"/>"
            svg += "<text x=\"\(left - 6)\" y=\"\(round(lineY + 4))\" class=\"axis\" text-anchor=\"end\">\(HTML.escape(format(value)))</text>"
        }
        // About six labels along the bottom.
        let every = max(1, count / 6)
        for (index, label) in labels.enumerated() where index % every == 0 {
            let x = left + step * (Double(index) + 0.5)
            svg += "<text x=\"\(round(x))\" y=\"\(height - 8)\" class=\"axis\" text-anchor=\"middle\">\(HTML.escape(label))</text>"
        }
        if bars {
            let barWidth = max(1, step * 0.8 / Double(max(series.count, 1)))
            for (seriesIndex, one) in series.enumerated() {
                for (index, value) in one.values.enumerated() {
                    let x = left + step * Double(index) + step * 0.1 + barWidth * Double(seriesIndex)
                    let top = y(max(value, 0))
                    let barHeight = abs(y(value) - y(0))
                    svg += "<rect x=\"\(round(x))\" y=\"\(round(top))\" width=\"\(round(barWidth))\" height=\"\(round(barHeight))\" fill=\"\(one.color)\">"
                    svg += "<title>\(HTML.escape(labels[safe: index] ?? "")) \(HTML.escape(one.name)): \(HTML.escape(format(value)))</title></rect>"
                }
            }
        } else {
            for one in series {
                let points = one.values.enumerated().map { index, value in
                    "\(round(left + step * (Double(index) + 0.5))),\(round(y(value)))"
                }.joined(separator: " ")
                svg += "<polyline points=\"\(points)\" fill=\"none\" stroke=\"\(one.color)\" stroke-width=\"2\"/>"
                if let last = one.values.last {
                    svg += "<circle cx=\"\(round(left + step * (Double(one.values.count - 1) + 0.5)))\" cy=\"\(round(y(last)))\" r=\"3\" fill=\"\(one.color)\">"
                    svg += "<title>\(HTML.escape(one.name)): \(HTML.escape(format(last)))</title></circle>"
                }
            }
        }
        svg += "</svg>"
        if series.count > 1 || bars {
            svg += "<div class=\"legend\">" + series.map { "<span><i style=\"background:\($0.color)\"></i>\(HTML.escape($0.name))</span>" }.joined() + "</div>"
        }
        return svg + "</figure>"
    }

    private static func round(_ value: Double) -> String { String(format: "%.1f", value) }

    /// 1, 2 or 5 times a power of ten, at least `value` (an axis step of a round size); 1 for nothing.
    static func niceCeiling(_ value: Double) -> Double {
        guard value > 0 else { return 1 }
        let power = pow(10, floor(log10(value)))
        for factor in [1.0, 2, 5, 10] where factor * power >= value { return factor * power }
        return 10 * power
    }
}

extension Array {
    subscript(safe index: Int) -> Element? { indices.contains(index) ? self[index] : nil }
}
