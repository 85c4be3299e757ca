use super::*;
use proptest::prelude::*;

#[test]
fn the_dictionary_is_spdy3s() {
    let d = dictionary();
    assert_eq!(d.len(), 1423);
    // Adler-32, as zlib's header names a preset dictionary.
    let (mut a, mut b) = (1u32, 0u32);
    for &x in d {
        a = (a + u32::from(x)) % 65521;
        b = (b + a) % 65521;
    }
    assert_eq!((b << 16) | a, 0xe3c6_a7c2);
}

#[test]
fn header_blocks_go_through_one_stream_each_way() {
    let (mut out, mut inp) = (Deflater::default(), Inflater::default());
    let first = out.block(&[
        ("streamType", "error"),
        ("port", "8080"),
        ("requestID", "0"),
    ]);
    // A zlib stream primed with the dictionary says so (FDICT) and names it by its Adler-32.
    assert!(first[1] & 0x20 != 0);
    assert_eq!(&first[2..6], &[0xe3, 0xc6, 0xa7, 0xc2]);
    assert_eq!(
        inp.headers(&first).expect("first"),
        [
            ("streamtype".to_string(), "error".to_string()),
            ("port".into(), "8080".into()),
            ("requestid".into(), "0".into())
        ]
    );
    let second = out.block(&[("streamType", "data"), ("port", "8080"), ("requestID", "0")]);
    assert_eq!(inp.headers(&second).expect("second")[0].1, "data");
    assert!(out.block(&[]).len() < 16);
    // A block inflating beyond the bound is refused.
    let big = "x".repeat(MAX_HEADERS);
    let huge = out.block(&[("a", big.as_str())]);
    assert!(inp.headers(&huge).is_err());
    // Garbage is an error, not a panic.
    assert!(Inflater::default().headers(b"not zlib at all").is_err());
}

/// A client's opening of streams 1 and 3, a data frame, a ping, stream 1 again, GOAWAY.
fn client_bytes() -> Vec<u8> {
    let mut d = Deflater::default();
    let mut bytes = Vec::new();
    for (stream, kind) in [(1, "error"), (3, "stdin")] {
        let block = d.block(&[("streamType", kind)]);
        bytes.extend(
            Frame::SynStream {
                stream,
                fin: false,
                block,
            }
            .encode(),
        );
    }
    bytes.extend(data(3, true, b"typed".to_vec()));
    bytes.extend(Frame::Ping(7).encode());
    let block = d.block(&[("streamType", "stdout")]);
    bytes.extend(
        Frame::SynStream {
            stream: 1,
            fin: false,
            block,
        }
        .encode(),
    );
    bytes.extend(Frame::GoAway { last: 3, status: 0 }.encode());
    bytes
}

#[test]
fn a_reader_gives_what_the_client_asks_and_refuses_a_stream_id_used_before() {
    let mut r = Reader::default();
    let inputs = r.feed(&client_bytes()).expect("a session");
    assert_eq!(inputs[0].header("streamtype"), Some("error"));
    assert_eq!(inputs[1].header("streamtype"), Some("stdin"));
    assert_eq!(
        inputs[2..],
        [
            Input::Data {
                stream: 3,
                fin: true,
                data: b"typed".to_vec()
            },
            Input::Ping(7),
            Input::Refuse {
                stream: 1,
                status: status::STREAM_IN_USE
            },
            Input::GoAway,
        ]
    );
    assert_eq!(r.last(), 3);
    let mut bad = Reader::default();
    assert!(bad.feed(&[0x80, 2, 0, 1, 0, 0, 0, 0]).is_err(), "version 2");
}

#[test]
fn frames_are_read_as_written() {
    let frames = [
        Frame::Data {
            stream: 3,
            fin: true,
            data: b"hello".to_vec(),
        },
        Frame::SynStream {
            stream: 1,
            fin: false,
            block: vec![1, 2, 3],
        },
        Frame::SynReply {
            stream: 1,
            fin: false,
            block: vec![9],
        },
        Frame::RstStream {
            stream: 5,
            status: status::REFUSED_STREAM,
        },
        Frame::Ping(7),
        Frame::GoAway { last: 9, status: 0 },
        Frame::Headers {
            stream: 1,
            fin: true,
            block: vec![],
        },
        Frame::WindowUpdate {
            stream: 1,
            delta: 65536,
        },
    ];
    let mut all = Vec::new();
    for f in &frames {
        all.extend(f.encode());
    }
    let mut at = 0;
    for f in &frames {
        let (got, n) = Frame::parse(&all[at..]).expect("ok").expect("whole");
        assert_eq!(&got, f);
        at += n;
    }
    assert_eq!(at, all.len());
    // A part of a frame waits for the rest.
    assert_eq!(Frame::parse(&all[..10]), Ok(None));
    // Another version, a length beyond the bound, a short control frame: errors.
    assert_eq!(
        Frame::parse(&[0x80, 2, 0, 6, 0, 0, 0, 4, 0, 0, 0, 1]),
        Err(Error::Version(2))
    );
    assert_eq!(
        Frame::parse(&[0, 0, 0, 1, 0, 0x20, 0, 0]),
        Err(Error::TooLarge(0x20_0000))
    );
    assert_eq!(
        Frame::parse(&[0x80, 3, 0, 3, 0, 0, 0, 4, 0, 0, 0, 1]),
        Err(Error::Short { kind: 3, len: 4 })
    );
}

proptest! {
    #[test]
    fn a_reader_gives_the_same_whatever_pieces_the_bytes_come_in(cuts in proptest::collection::vec(0usize..400, 0..8)) {
        let bytes = client_bytes();
        let whole = Reader::default().feed(&bytes).expect("whole");
        let mut r = Reader::default();
        let mut got = Vec::new();
        let mut at = 0;
        let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(bytes.len())).collect();
        cuts.sort_unstable();
        for c in cuts.into_iter().chain([bytes.len()]) {
            got.extend(r.feed(&bytes[at..c]).expect("pieces"));
            at = c;
        }
        prop_assert_eq!(got, whole);
    }

    /// Any bytes: a frame, an error or a wait for more; never a panic, and a frame never
    /// takes more bytes than there are.
    #[test]
    fn any_bytes_parse_without_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
        if let Ok(Some((_, n))) = Frame::parse(&bytes) {
            prop_assert!(n <= bytes.len() && n >= 8);
        }
        let _ = Inflater::default().headers(&bytes);
        let _ = parse_block(&bytes);
    }

    /// Frames built from the grammar's parts read back as themselves.
    #[test]
    fn frames_round_trip(stream in 0u32..0x7fff_ffff, fin: bool,
                         data in proptest::collection::vec(any::<u8>(), 0..300),
                         status: u32, kind in 0usize..4) {
        let f = match kind {
            0 => Frame::Data { stream, fin, data },
            1 => Frame::SynStream { stream, fin, block: data },
            2 => Frame::RstStream { stream, status },
            _ => Frame::Headers { stream, fin, block: data },
        };
        let bytes = f.encode();
        prop_assert_eq!(Frame::parse(&bytes), Ok(Some((f, bytes.len()))));
    }

    /// Header pairs through a deflater and an inflater, block after block.
    #[test]
    fn header_pairs_round_trip(blocks in proptest::collection::vec(
        proptest::collection::vec(("[a-z-]{1,12}", "[ -~]{0,40}"), 0..6), 1..4)) {
        let (mut out, mut inp) = (Deflater::default(), Inflater::default());
        for pairs in blocks {
            let refs: Vec<(&str, &str)> = pairs.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
            let got = inp.headers(&out.block(&refs)).expect("inflate");
            prop_assert_eq!(got, pairs);
        }
    }
}
