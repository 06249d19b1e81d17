//! The I/O lanes: every backend and lane count reads the same bytes as the plain reader, and
//! an injected fault, a file cut short or a bad id comes back as an error naming the expert.

use gguf::GgufFile;
use store::cache::AlignedBuf;
use store::{Backend, ExpertLayout, ExpertReader, IoLanes, IoMode, ReadFault, ReadJob};

mod common;
use common::{model, paths};

fn backends() -> Vec<Backend> {
    let mut b = vec![Backend::Pread];
    if store::uring_available() {
        b.push(Backend::Uring);
    }
    b
}

/// Every expert of every layer through the lanes, all submitted at once; each completion's
/// slot holds the plain reader's bytes.
#[test]
fn lanes_read_what_the_reader_reads() {
    let dir = tempfile::tempdir().unwrap();
    let f = GgufFile::open(model(dir.path())).unwrap();
    let layout = ExpertLayout::from_gguf(&f).unwrap().unwrap();
    let plain = ExpertReader::open(&paths(&f), &layout, IoMode::Buffered).unwrap();
    for backend in backends() {
        for mode in [IoMode::Auto, IoMode::Buffered] {
            for lanes in [1, 4] {
                let mut io =
                    IoLanes::start(&paths(&f), &layout, mode, lanes, backend, None).unwrap();
                assert_eq!(io.backend(), backend);
                let mut want = 0;
                for l in &layout.layers {
                    for e in 0..layout.n_expert {
                        let buf = AlignedBuf::new(plain.slot_bytes(l.layer).unwrap());
                        io.submit(ReadJob {
                            layer: l.layer,
                            expert: e,
                            buf,
                            demand: e % 2 == 0,
                        });
                        want += 1;
                    }
                }
                let mut seen = 0;
                while let Some(done) = io.wait() {
                    seen += 1;
                    let bytes = done.result.unwrap();
                    let windows = plain.windows(done.layer, done.expert).unwrap();
                    assert_eq!(bytes, windows.iter().map(|w| w.len as u64).sum::<u64>());
                    let mut slot = AlignedBuf::new(done.buf.len());
                    plain
                        .read(done.layer, done.expert, slot.as_mut_slice())
                        .unwrap();
                    let parts = layout.layer(done.layer).unwrap().parts.len();
                    for i in 0..parts {
                        assert_eq!(
                            plain
                                .part(done.layer, done.expert, i, done.buf.as_slice())
                                .unwrap(),
                            plain
                                .part(done.layer, done.expert, i, slot.as_slice())
                                .unwrap(),
                            "{backend:?} {mode:?} {lanes} lanes: layer {} expert {} part {i}",
                            done.layer,
                            done.expert
                        );
                    }
                }
                assert_eq!(seen, want);
                assert_eq!(io.in_flight(), 0);
            }
        }
    }
}

#[test]
fn injected_faults_and_cut_files_are_errors_naming_the_expert() {
    let dir = tempfile::tempdir().unwrap();
    let first = model(dir.path());
    let f = GgufFile::open(&first).unwrap();
    let layout = ExpertLayout::from_gguf(&f).unwrap().unwrap();
    let plain = ExpertReader::open(&paths(&f), &layout, IoMode::Buffered).unwrap();
    let slot = plain.slot_bytes(0).unwrap();
    let gate0 = &layout.layer(0).unwrap().parts[0];
    for backend in backends() {
        for short in [false, true] {
            let fault = ReadFault {
                layer: 0,
                expert: 3,
                short,
            };
            let mut io =
                IoLanes::start(&paths(&f), &layout, IoMode::Auto, 2, backend, Some(fault)).unwrap();
            for e in 2..5 {
                io.submit(ReadJob {
                    layer: 0,
                    expert: e,
                    buf: AlignedBuf::new(slot),
                    demand: true,
                });
            }
            while let Some(done) = io.wait() {
                if done.expert != 3 {
                    done.result.unwrap();
                    continue;
                }
                let err = done.result.unwrap_err().to_string();
                let head = format!(
                    "layer 0, expert 3: reading blk.0.ffn_gate_exps.weight at byte {} of ",
                    gate0.expert_offset(3)
                );
                let tail = if short {
                    "(the file ends early)"
                } else {
                    "injected read error"
                };
                assert!(
                    err.starts_with(&head) && err.ends_with(tail),
                    "{backend:?}: {err}"
                );
            }
        }
    }
    // A file cut inside layer 1's last down expert (the end of shard 2).
    let last = &layout.layer(1).unwrap().parts[2];
    let cut = last.expert_offset(5) + 10;
    std::fs::OpenOptions::new()
        .write(true)
        .open(&paths(&f)[1])
        .unwrap()
        .set_len(cut)
        .unwrap();
    for backend in backends() {
        let mut io =
            IoLanes::start(&paths(&f), &layout, IoMode::Buffered, 2, backend, None).unwrap();
        io.submit(ReadJob {
            layer: 1,
            expert: 5,
            buf: AlignedBuf::new(plain.slot_bytes(1).unwrap()),
            demand: true,
        });
        // An id outside the model is refused, not read.
        io.submit(ReadJob {
            layer: 1,
            expert: 6,
            buf: AlignedBuf::new(plain.slot_bytes(1).unwrap()),
            demand: true,
        });
        let mut errs = Vec::new();
        while let Some(done) = io.wait() {
            errs.push((done.expert, done.result.unwrap_err().to_string()));
        }
        errs.sort();
        assert!(
            errs[0]
                .1
                .ends_with("short read: 10 of 256 bytes (the file ends early)"),
            "{backend:?}: {}",
            errs[0].1
        );
        assert!(
            errs[1].1.contains("expert 6 does not exist"),
            "{}",
            errs[1].1
        );
    }
}

/// More jobs in flight than an io_uring's submission queue holds windows for: the ring takes
/// as many as fit and the rest wait their turn; every job comes back.
#[test]
fn a_deep_uring_queue_never_overflows() {
    if !store::uring_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let f = GgufFile::open(model(dir.path())).unwrap();
    let layout = ExpertLayout::from_gguf(&f).unwrap().unwrap();
    let plain = ExpertReader::open(&paths(&f), &layout, IoMode::Buffered).unwrap();
    // 3 windows per job: 1400 jobs in flight would need 4200 entries, past the 4096 cap.
    let mut io = IoLanes::start(
        &paths(&f),
        &layout,
        IoMode::Buffered,
        1400,
        Backend::Uring,
        None,
    )
    .unwrap();
    let n = 3000;
    for i in 0..n {
        io.submit(ReadJob {
            layer: 1,
            expert: i % layout.n_expert,
            buf: AlignedBuf::new(plain.slot_bytes(1).unwrap()),
            demand: true,
        });
    }
    let mut seen = 0;
    while let Some(done) = io.wait() {
        done.result.unwrap();
        seen += 1;
    }
    assert_eq!(seen, n);
}
