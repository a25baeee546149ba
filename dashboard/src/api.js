// The service's own API with the signed-in key: the page reaches nothing the
// key could not reach through the SDK. The key lives in sessionStorage (gone
// when the tab closes) and travels only in the Authorization header.

const KEY = "marlaas.apiKey";
const ADMIN_PREFIX = "sk-marlaas-admin-";

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

export function storedKey() {
  return sessionStorage.getItem(KEY);
}

export function storeKey(key) {
  sessionStorage.setItem(KEY, key);
}

export function forgetKey() {
  sessionStorage.removeItem(KEY);
}

export function isAdminKey(key) {
  return key.startsWith(ADMIN_PREFIX);
}

export class Api {
  constructor(key) {
    this.key = key;
  }

  async get(path, params = {}) {
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries(params)) {
      if (v !== null && v !== undefined) q.set(k, String(v));
    }
    const url = q.size ? `${path}?${q}` : path;
    const res = await fetch(url, {
      headers: { Authorization: `Bearer ${this.key}` },
      cache: "no-store",
      credentials: "omit",
    });
    const body = await res.json().catch(() => ({}));
    if (!res.ok) {
      const msg = body?.error?.message || `${res.status} ${res.statusText}`;
      throw new ApiError(res.status, msg);
    }
    return body;
  }

  // Every page of a cursor-paged list (OpenAI's {data, has_more} + after=id).
  async all(path, params = {}, max = 20) {
    const out = [];
    let after;
    for (let page = 0; page < max; page++) {
      const body = await this.get(path, { limit: 100, ...params, after });
      out.push(...body.data);
      if (!body.has_more || body.data.length === 0) break;
      after = body.data[body.data.length - 1].id;
    }
    return out;
  }

  // Newest-first pages until one holds an id already in `seen` (a Map by id):
  // a poll fetches one page, not the whole history.
  async newer(path, seen, max = 50) {
    let after;
    for (let page = 0; page < max; page++) {
      const body = await this.get(path, { limit: 100, after });
      let known = false;
      for (const item of body.data) {
        if (seen.has(item.id)) known = true;
        seen.set(item.id, item);
      }
      if (known || !body.has_more || body.data.length === 0) break;
      after = body.data[body.data.length - 1].id;
    }
    return seen;
  }
}
