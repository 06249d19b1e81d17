//! The HTTP/1.1 the server speaks, over a blocking socket: request heads parsed by `httparse`
//! within size limits, bodies delimited by `Content-Length` (a chunked request body is refused),
//! `Expect: 100-continue` answered, keep-alive between requests, responses with a length or an
//! event stream that ends with the connection.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// Size limits of what a client may send.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Bytes of a request head (request line and headers).
    pub max_head: usize,
    /// Headers in a request.
    pub max_headers: usize,
    /// Bytes of a request body.
    pub max_body: usize,
    /// How long a client may take to send a request (and how long an idle kept-alive
    /// connection stays open).
    pub read_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_head: 16 << 10,
            max_headers: 64,
            max_body: 4 << 20,
            read_timeout: Duration::from_secs(30),
        }
    }
}

/// A request as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub method: String,
    /// The request target as sent (path and query).
    pub target: String,
    /// Header names lower-cased, in order.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// The client keeps the connection open after the response (HTTP/1.1 without
    /// `Connection: close`).
    pub keep_alive: bool,
}

impl Request {
    /// The first value of header `name` (lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The target's path, without the query.
    pub fn path(&self) -> &str {
        self.target.split(['?', '#']).next().unwrap_or("")
    }

    /// The value of query parameter `key`.
    pub fn query(&self, key: &str) -> Option<&str> {
        let (_, q) = self.target.split_once('?')?;
        q.split('&')
            .filter_map(|kv| kv.split_once('='))
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v)
    }
}

/// Why no request could be read; each but `Closed` and `Io` has the status to answer.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The client closed the connection (or stayed idle past the timeout) between requests.
    #[error("the connection closed")]
    Closed,
    #[error("reading the request: {0}")]
    Io(#[from] io::Error),
    #[error("the request head is larger than {0} bytes or has too many headers")]
    HeadTooLarge(usize),
    #[error("malformed request: {0}")]
    Bad(String),
    #[error("the request body is {len} bytes, more than the {max} allowed")]
    BodyTooLarge { len: u64, max: usize },
    #[error("a request body needs a Content-Length (chunked request bodies are not accepted)")]
    LengthRequired,
}

impl ReadError {
    /// The status to answer with (none for a closed or failed connection).
    pub fn status(&self) -> Option<u16> {
        match self {
            ReadError::Closed | ReadError::Io(_) => None,
            ReadError::HeadTooLarge(_) => Some(431),
            ReadError::Bad(_) => Some(400),
            ReadError::BodyTooLarge { .. } => Some(413),
            ReadError::LengthRequired => Some(411),
        }
    }
}

/// A client connection: the socket and what was read past the last request.
pub struct Conn {
    pub stream: TcpStream,
    buf: Vec<u8>,
}

impl Conn {
    pub fn new(stream: TcpStream) -> Conn {
        Conn {
            stream,
            buf: Vec::new(),
        }
    }

    /// Reads the next request: its head within `limits`, then its body (after a `100
    /// Continue` when the client waits for one).
    pub fn read_request(&mut self, limits: &Limits) -> Result<Request, ReadError> {
        self.stream.set_read_timeout(Some(limits.read_timeout))?;
        let head_len = loop {
            if let Some(end) = find_head_end(&self.buf) {
                break end;
            }
            if self.buf.len() > limits.max_head {
                return Err(ReadError::HeadTooLarge(limits.max_head));
            }
            let mut chunk = [0u8; 4096];
            let n = match self.stream.read(&mut chunk) {
                Ok(n) => n,
                Err(e)
                    if self.buf.is_empty()
                        && matches!(
                            e.kind(),
                            io::ErrorKind::WouldBlock
                                | io::ErrorKind::TimedOut
                                | io::ErrorKind::ConnectionReset
                        ) =>
                {
                    return Err(ReadError::Closed);
                }
                Err(e) => return Err(e.into()),
            };
            if n == 0 {
                return Err(if self.buf.is_empty() {
                    ReadError::Closed
                } else {
                    ReadError::Bad("the connection closed inside the request head".into())
                });
            }
            self.buf.extend_from_slice(&chunk[..n]);
        };
        if head_len > limits.max_head {
            return Err(ReadError::HeadTooLarge(limits.max_head));
        }
        let mut headers = vec![httparse::EMPTY_HEADER; limits.max_headers];
        let mut req = httparse::Request::new(&mut headers);
        match req.parse(&self.buf[..head_len]) {
            Ok(httparse::Status::Complete(_)) => {}
            Ok(httparse::Status::Partial) => {
                return Err(ReadError::Bad("incomplete request head".into()));
            }
            Err(httparse::Error::TooManyHeaders) => {
                return Err(ReadError::HeadTooLarge(limits.max_head));
            }
            Err(e) => return Err(ReadError::Bad(e.to_string())),
        }
        let method = req.method.unwrap_or("").to_owned();
        let target = req.path.unwrap_or("").to_owned();
        let version = req.version.unwrap_or(0);
        let mut list = Vec::with_capacity(req.headers.len());
        for h in req.headers.iter() {
            let value = std::str::from_utf8(h.value)
                .map_err(|_| ReadError::Bad(format!("header {:?} is not UTF-8 text", h.name)))?;
            list.push((h.name.to_ascii_lowercase(), value.trim().to_owned()));
        }
        self.buf.drain(..head_len);
        let mut request = Request {
            method,
            target,
            keep_alive: false,
            headers: list,
            body: Vec::new(),
        };
        let connection = request
            .header("connection")
            .map(str::to_ascii_lowercase)
            .unwrap_or_default();
        request.keep_alive = if version >= 1 {
            !connection.contains("close")
        } else {
            connection.contains("keep-alive")
        };
        if request.header("transfer-encoding").is_some() {
            return Err(ReadError::LengthRequired);
        }
        let len = match request.header("content-length") {
            None => 0,
            Some(v) => v
                .parse::<u64>()
                .map_err(|_| ReadError::Bad(format!("Content-Length {v:?} is not a number")))?,
        };
        if len > limits.max_body as u64 {
            return Err(ReadError::BodyTooLarge {
                len,
                max: limits.max_body,
            });
        }
        let len = len as usize;
        if len > 0
            && self.buf.len() < len
            && request
                .header("expect")
                .is_some_and(|e| e.eq_ignore_ascii_case("100-continue"))
        {
            self.stream.write_all(b"HTTP/1.1 100 Continue\r\n\r\n")?;
        }
        while self.buf.len() < len {
            let mut chunk = vec![0u8; (len - self.buf.len()).min(64 << 10)];
            let n = self.stream.read(&mut chunk)?;
            if n == 0 {
                return Err(ReadError::Bad(format!(
                    "the connection closed after {} of {len} body bytes",
                    self.buf.len()
                )));
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
        request.body = self.buf.drain(..len).collect();
        Ok(request)
    }

    /// Whether the client is still there: a closed connection reads as its end without
    /// waiting. (Bytes the client sent ahead are left for the next request.)
    pub fn peer_alive(&self) -> bool {
        if self.stream.set_nonblocking(true).is_err() {
            return false;
        }
        let mut b = [0u8; 1];
        let alive = match self.stream.peek(&mut b) {
            Ok(0) => false,
            Ok(_) => true,
            Err(e) => e.kind() == io::ErrorKind::WouldBlock,
        };
        alive && self.stream.set_nonblocking(false).is_ok()
    }
}

/// Closes a connection whose request was not read whole (an error answered early): the
/// write side first, then what the client still sends is read and dropped for a moment, so
/// that the answer reaches it rather than a reset.
pub fn linger_close(stream: &TcpStream) {
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    let mut sink = [0u8; 16 << 10];
    let mut left: usize = 4 << 20;
    let mut r = stream;
    while left > 0 {
        match r.read(&mut sink) {
            Ok(0) | Err(_) => break,
            Ok(n) => left = left.saturating_sub(n),
        }
    }
}

/// The end of the head (past its blank line) in `buf`.
fn find_head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|p| p + 4)
}

/// The reason phrase of a status.
pub fn reason(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        200 => "OK",
        204 => "No Content",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        411 => "Length Required",
        413 => "Payload Too Large",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Unknown",
    }
}

/// Headers every response carries.
const COMMON: &str = "Server: sluice\r\nX-Content-Type-Options: nosniff\r\n\
    X-Frame-Options: DENY\r\nReferrer-Policy: no-referrer\r\nCache-Control: no-store\r\n";

/// A whole response with a body of known length.
pub fn respond(
    w: &mut impl Write,
    status: u16,
    content_type: &str,
    extra: &[(&str, &str)],
    body: &[u8],
    keep_alive: bool,
) -> io::Result<()> {
    let mut head = format!(
        "HTTP/1.1 {status} {}\r\n{COMMON}Content-Type: {content_type}\r\nContent-Length: {}\r\n\
         Connection: {}\r\n",
        reason(status),
        body.len(),
        if keep_alive { "keep-alive" } else { "close" }
    );
    for (k, v) in extra {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    w.write_all(head.as_bytes())?;
    w.write_all(body)?;
    w.flush()
}

/// The head of an event stream (`text/event-stream`, ended by closing the connection).
pub fn start_events(w: &mut impl Write) -> io::Result<()> {
    let head = format!(
        "HTTP/1.1 200 OK\r\n{COMMON}Content-Type: text/event-stream\r\nConnection: close\r\n\
         X-Accel-Buffering: no\r\n\r\n"
    );
    w.write_all(head.as_bytes())?;
    w.flush()
}

/// One event: `data: <line>` (and `event: <name>` when named), flushed.
pub fn event(w: &mut impl Write, name: Option<&str>, data: &str) -> io::Result<()> {
    let mut s = String::with_capacity(data.len() + 32);
    if let Some(n) = name {
        s.push_str("event: ");
        s.push_str(n);
        s.push('\n');
    }
    for line in data.split('\n') {
        s.push_str("data: ");
        s.push_str(line);
        s.push('\n');
    }
    s.push('\n');
    w.write_all(s.as_bytes())?;
    w.flush()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// A connection whose client side sends `bytes` (then keeps the socket open).
    fn conn_with(bytes: &[u8]) -> (Conn, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        client.write_all(bytes).unwrap();
        let (s, _) = l.accept().unwrap();
        (Conn::new(s), client)
    }

    fn limits() -> Limits {
        Limits {
            max_head: 256,
            max_headers: 8,
            max_body: 64,
            read_timeout: Duration::from_secs(5),
        }
    }

    #[test]
    fn reads_pipelined_requests_with_bodies() {
        let (mut c, _client) = conn_with(
            b"POST /v1/x?a=1&b=2 HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nhelloGET / HTTP/1.1\r\nConnection: close\r\n\r\n",
        );
        let r = c.read_request(&limits()).unwrap();
        assert_eq!((r.method.as_str(), r.path()), ("POST", "/v1/x"));
        assert_eq!(r.query("b"), Some("2"));
        assert_eq!(r.header("host"), Some("h"));
        assert_eq!(r.body, b"hello");
        assert!(r.keep_alive);
        let r = c.read_request(&limits()).unwrap();
        assert_eq!((r.method.as_str(), r.path()), ("GET", "/"));
        assert!(r.body.is_empty());
        assert!(!r.keep_alive);
    }

    #[test]
    fn refuses_what_is_too_large_or_unframed() {
        let (mut c, _k) = conn_with(b"POST / HTTP/1.1\r\nContent-Length: 65\r\n\r\n");
        let e = c.read_request(&limits()).unwrap_err();
        assert_eq!(e.status(), Some(413), "{e}");
        let big = format!("GET / HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(300));
        let (mut c, _k) = conn_with(big.as_bytes());
        assert_eq!(c.read_request(&limits()).unwrap_err().status(), Some(431));
        let many: String = (0..9).map(|i| format!("X{i}: v\r\n")).collect();
        let (mut c, _k) = conn_with(format!("GET / HTTP/1.1\r\n{many}\r\n").as_bytes());
        assert_eq!(c.read_request(&limits()).unwrap_err().status(), Some(431));
        let (mut c, _k) = conn_with(
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        );
        assert_eq!(c.read_request(&limits()).unwrap_err().status(), Some(411));
        let (mut c, _k) = conn_with(b"GET / HTTP/1.1\r\nContent-Length: x\r\n\r\n");
        assert_eq!(c.read_request(&limits()).unwrap_err().status(), Some(400));
        let (mut c, _k) = conn_with(b"NOT HTTP\r\n\r\n");
        assert_eq!(c.read_request(&limits()).unwrap_err().status(), Some(400));
    }

    #[test]
    fn answers_expect_continue_and_sees_a_closed_peer() {
        let (mut c, mut client) =
            conn_with(b"POST / HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n");
        let t = std::thread::spawn(move || {
            let mut b = [0u8; 25];
            client.read_exact(&mut b).unwrap();
            assert_eq!(&b, b"HTTP/1.1 100 Continue\r\n\r\n");
            client.write_all(b"ok").unwrap();
            client
        });
        let r = c.read_request(&limits()).unwrap();
        assert_eq!(r.body, b"ok");
        let client = t.join().unwrap();
        assert!(c.peer_alive());
        drop(client);
        // The close is seen once the FIN arrives; a blocking read of the end confirms it.
        let mut b = [0u8; 1];
        assert_eq!(c.stream.read(&mut b).unwrap(), 0);
        assert!(!c.peer_alive());
        assert!(matches!(
            c.read_request(&limits()).unwrap_err(),
            ReadError::Closed
        ));
    }

    #[test]
    fn events_split_lines_into_data_fields() {
        let mut out = Vec::new();
        event(&mut out, Some("token"), "a\nb").unwrap();
        event(&mut out, None, "[DONE]").unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "event: token\ndata: a\ndata: b\n\ndata: [DONE]\n\n"
        );
    }
}
