"""A toy web request handler that burns CPU in a few named functions.

`cargo xtask demo` profiles this script with `pyebpf record`; the flame graph should show
`serve` -> `handle_request` splitting into `parse_request`, `render_page` (the hot path:
`render_row` and `escape_html`) and `compute_etag`.

Runs for --seconds (default 8) or until killed.
"""

import argparse
import time

REQUEST = (
    "GET /orders?customer=ada%20lovelace&page=3&sort=date&limit=40 HTTP/1.1\r\n"
    "Host: shop.example\r\n"
    "Accept: text/html\r\n"
    "User-Agent: demo\r\n"
    "Cookie: "
    + "; ".join("pref%d=value%%20number%%20%d" % (i, i) for i in range(12))
    + "\r\n"
    "\r\n"
)


def url_decode(text):
    out = []
    i = 0
    while i < len(text):
        c = text[i]
        if c == "%" and i + 2 < len(text):
            out.append(chr(int(text[i + 1 : i + 3], 16)))
            i += 3
        else:
            out.append(" " if c == "+" else c)
            i += 1
    return "".join(out)


def parse_request(raw):
    """Request line, query string, headers and cookies: about 10% of the time."""
    head, _, _ = raw.partition("\r\n\r\n")
    lines = head.split("\r\n")
    method, target, _version = lines[0].split(" ")
    path, _, query = target.partition("?")
    params = {}
    for pair in query.split("&"):
        key, _, value = pair.partition("=")
        params[url_decode(key)] = url_decode(value)
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    cookies = {}
    for pair in headers.get("cookie", "").split(";"):
        key, _, value = pair.strip().partition("=")
        cookies[key] = url_decode(value)
    headers["cookie"] = cookies
    return method, path, params, headers


def load_orders(customer, page, limit):
    """Fake database: deterministic rows."""
    base = page * limit
    return [
        {
            "id": base + i,
            "customer": customer,
            "item": "widget <%d> & co" % ((base + i) % 17),
            "qty": (base + i) % 5 + 1,
            "price": ((base + i) * 37) % 1000 / 10,
        }
        for i in range(limit)
    ]


def escape_html(text):
    out = []
    for c in text:
        if c == "<":
            out.append("&lt;")
        elif c == ">":
            out.append("&gt;")
        elif c == "&":
            out.append("&amp;")
        elif c == '"':
            out.append("&quot;")
        else:
            out.append(c)
    return "".join(out)


def render_row(order):
    cells = [
        str(order["id"]),
        escape_html(order["customer"]),
        escape_html(order["item"]),
        str(order["qty"]),
        "%.2f" % (order["qty"] * order["price"]),
    ]
    return "<tr>" + "".join("<td>%s</td>" % c for c in cells) + "</tr>"


def render_page(params):
    """The hot path: HTML for every row, about half of the time."""
    orders = load_orders(
        params.get("customer", "anonymous"),
        int(params.get("page", "0")),
        int(params.get("limit", "20")),
    )
    rows = [render_row(o) for o in orders]
    return "<html><body><table>" + "\n".join(rows) + "</table></body></html>"


def compute_etag(body):
    """Weak ETag: FNV-1a over every 4th byte, in pure Python on purpose (about a third)."""
    h = 0xCBF29CE484222325
    for b in body.encode()[::4]:
        h ^= b
        h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return '"%016x"' % h


def handle_request(raw):
    method, path, params, headers = parse_request(raw)
    if method != "GET" or path != "/orders":
        return 404, "", None
    body = render_page(params)
    return 200, body, compute_etag(body)


def serve(seconds):
    deadline = time.monotonic() + seconds
    handled = 0
    while time.monotonic() < deadline:
        status, body, etag = handle_request(REQUEST)
        assert status == 200 and etag
        handled += 1
    return handled


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0)
    args = parser.parse_args()
    start = time.monotonic()
    handled = serve(args.seconds)
    elapsed = time.monotonic() - start
    print("handled %d requests in %.1fs (%.0f/s)" % (handled, elapsed, handled / elapsed))


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        pass
