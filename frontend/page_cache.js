// A cache of fixed-size, page-aligned slices of one server-side list. Pure (no DOM): the
// fetch function is injected, so node tests drive it with a fake server.

/**
 * Page indices covering rows [begin, end).
 * @returns {number[]}
 */
export function pagesFor(begin, end, pageSize) {
  if (end <= begin) return [];
  const first = Math.floor(Math.max(0, begin) / pageSize);
  const last = Math.floor((end - 1) / pageSize);
  const pages = [];
  for (let p = first; p <= last; p++) pages.push(p);
  return pages;
}

export class PageCache {
  /**
   * @param {object} opts
   * @param {(begin: number, end: number) => Promise<{begin: number, end: number, total: number,
   *     items: any[]}>} opts.fetchPage the paged route; must answer the one paging shape.
   * @param {number} [opts.pageSize=500] at or under the server's page cap, so one request
   *     fills one page.
   * @param {number} [opts.maxPages=40] pages kept; the least recently used go first, so memory
   *     stays flat however far the user scrolls.
   */
  constructor({fetchPage, pageSize = 500, maxPages = 40}) {
    this._fetchPage = fetchPage;
    this.pageSize = pageSize;
    this.maxPages = maxPages;
    this.total = null;
    this._pages = new Map();
    this._inflight = new Map();
    this.lastError = null;
  }

  /** The row at `index` if its page is loaded, else undefined. Never fetches. */
  get(index) {
    const page = this._pages.get(Math.floor(index / this.pageSize));
    if (!page) return undefined;
    this._touch(Math.floor(index / this.pageSize), page);
    return page[index % this.pageSize];
  }

  /** True when every row of [begin, end) is loaded. */
  has(begin, end) {
    return pagesFor(begin, end, this.pageSize).every((p) => this._pages.has(p));
  }

  /**
   * Loads the pages covering [begin, end), one request per missing page; concurrent callers
   * share in-flight requests.
   * @returns {Promise<void>} rejects with the fetch's error (also kept in `lastError`).
   */
  async ensure(begin, end) {
    const hi = this.total === null ? end : Math.min(end, this.total);
    const waits = pagesFor(begin, hi, this.pageSize).map((p) => this._load(p));
    await Promise.all(waits);
  }

  /** Fetches the first page if nothing is known yet, so `total` is set. */
  async ensureTotal() {
    if (this.total === null) await this._load(0);
    return this.total;
  }

  _load(page) {
    if (this._pages.has(page)) return Promise.resolve();
    const pending = this._inflight.get(page);
    if (pending) return pending;
    const begin = page * this.pageSize;
    const request = this._fetchPage(begin, begin + this.pageSize).then(
      (answer) => {
        this._inflight.delete(page);
        this.total = answer.total;
        this.lastError = null;
        this._pages.set(page, answer.items);
        this._evict();
      },
      (err) => {
        this._inflight.delete(page);
        this.lastError = err;
        throw err;
      });
    this._inflight.set(page, request);
    return request;
  }

  _touch(page, items) {
    // Map keeps insertion order: re-inserting marks the page most recently used.
    this._pages.delete(page);
    this._pages.set(page, items);
  }

  _evict() {
    while (this._pages.size > this.maxPages) {
      this._pages.delete(this._pages.keys().next().value);
    }
  }

  /** Number of pages held (for tests and the memory bound). */
  get size() {
    return this._pages.size;
  }
}
