/// The pages of a paginated App Store Server API call, fetched one at a time as the loop asks:
/// `for try await page in client.transactionHistory(...)`. Pages, not items, so a caller can store
/// each page's token (`revision`, `paginationToken`) and resume a long walk where it stopped.
///
/// A failed page ends the loop with its error (after the client's retries). A server that hands back
/// the token it was just given would loop forever, so that ends the walk as `.invalidResponse`.
public struct AppStorePages<Page: Sendable>: AsyncSequence, Sendable {
    public typealias Element = Page
    public typealias Failure = AppStoreAPIError

    /// Fetches the page at a token (nil: the first), returning it and the next page's token (nil: last).
    typealias Fetch = @Sendable (_ token: String?) async throws(AppStoreAPIError) -> (page: Page, next: String?)

    let start: String?
    let fetch: Fetch

    init(startingAt start: String?, fetch: @escaping Fetch) {
        self.start = start
        self.fetch = fetch
    }

    public func makeAsyncIterator() -> Iterator { Iterator(token: start, fetch: fetch) }

    public struct Iterator: AsyncIteratorProtocol, Sendable {
        public typealias Element = Page
        public typealias Failure = AppStoreAPIError

        var token: String?
        var finished = false
        let fetch: Fetch

        public mutating func next() async throws(AppStoreAPIError) -> Page? {
            guard !finished else { return nil }
            let result: (page: Page, next: String?)
            do {
                result = try await fetch(token)
            } catch {
                finished = true
                throw error
            }
            if let next = result.next, next == token {
                finished = true
                throw AppStoreAPIError(.invalidResponse, "Apple answered a page with the pagination token it was asked for, \"\(AppStoreAPIError.excerpt(next))\"; stopped so as not to loop")
            }
            token = result.next
            finished = result.next == nil
            return result.page
        }

        public mutating func next(isolation actor: isolated (any Actor)?) async throws(AppStoreAPIError) -> Page? {
            try await next()
        }
    }
}
