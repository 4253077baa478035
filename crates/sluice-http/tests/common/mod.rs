//! What the socket tests share: a server on a thread of its own, and reading a response's head.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// Runs `serve` on a listener bound to a free port, on a runtime in a thread of its own.
pub fn serve_on<F, Fut>(serve: F) -> SocketAddr
where
    F: FnOnce(tokio::net::TcpListener) -> Fut + Send + 'static,
    Fut: Future<Output = ()>,
{
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(listener.local_addr().unwrap()).unwrap();
            serve(listener).await;
        });
    });
    rx.recv_timeout(Duration::from_secs(60)).unwrap()
}

/// A connection to `addr` whose reads give up after a minute.
pub fn connect(addr: SocketAddr) -> BufReader<TcpStream> {
    let stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    BufReader::new(stream)
}

/// Sends `request` and reads the response up to its body: the status and the lower-cased
/// head.
pub fn send(stream: &mut BufReader<TcpStream>, request: &str) -> (u16, String) {
    stream.get_mut().write_all(request.as_bytes()).unwrap();
    let mut head = String::new();
    loop {
        let mut line = String::new();
        stream.read_line(&mut line).unwrap();
        if line == "\r\n" || line.is_empty() {
            break;
        }
        head.push_str(&line.to_ascii_lowercase());
    }
    (head[9..12].parse().unwrap(), head)
}
