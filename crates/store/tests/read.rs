//! Reading experts into aligned slots: the bytes equal the tensor data, with O_DIRECT and
//! through the page cache, across shards; a file cut short is an error naming the expert.

use gguf::GgufFile;
use store::cache::AlignedBuf;
use store::{ExpertLayout, ExpertReader, IoMode};

mod common;
use common::{model, paths};

#[test]
fn every_expert_reads_back_as_its_tensor_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let f = GgufFile::open(model(dir.path())).unwrap();
    let layout = ExpertLayout::from_gguf(&f).unwrap().unwrap();
    for mode in [IoMode::Auto, IoMode::Buffered] {
        let r = ExpertReader::open(&paths(&f), &layout, mode).unwrap();
        if mode == IoMode::Buffered {
            assert!(!r.direct());
        }
        for l in &layout.layers {
            let mut slot = AlignedBuf::new(r.slot_bytes(l.layer).unwrap());
            for e in 0..layout.n_expert {
                r.read(l.layer, e, slot.as_mut_slice()).unwrap();
                for (i, p) in l.parts.iter().enumerate() {
                    let t = f.tensor(&p.tensor).unwrap();
                    let data = f.tensor_data(t).unwrap();
                    let s = p.stride as usize;
                    let want = &data[e as usize * s..(e as usize + 1) * s];
                    let got = r.part(l.layer, e, i, slot.as_slice()).unwrap();
                    assert_eq!(
                        got, want,
                        "{mode:?} layer {} expert {e} {}",
                        l.layer, p.tensor
                    );
                }
            }
        }
    }
}

/// The file system type of the mount holding `path` (the longest mount point that prefixes it).
fn fs_type(path: &std::path::Path) -> String {
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    let path = path.canonicalize().unwrap();
    mounts
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() > 2 && path.starts_with(f[1])).then(|| (f[1].len(), f[2].to_owned()))
        })
        .max()
        .map(|(_, t)| t)
        .unwrap_or_default()
}

#[test]
fn o_direct_is_used_on_file_systems_that_take_it() {
    let dir = tempfile::tempdir().unwrap();
    let f = GgufFile::open(model(dir.path())).unwrap();
    let layout = ExpertLayout::from_gguf(&f).unwrap().unwrap();
    let r = ExpertReader::open(&paths(&f), &layout, IoMode::Auto).unwrap();
    let ty = fs_type(dir.path());
    // The local disk file systems take O_DIRECT; elsewhere Auto may fall back (the other
    // tests read correctly either way).
    if ["ext4", "xfs", "btrfs"].contains(&ty.as_str()) {
        assert!(r.direct(), "{ty}");
    }
    assert!(
        !ExpertReader::open(&paths(&f), &layout, IoMode::Buffered)
            .unwrap()
            .direct()
    );
}

#[test]
fn a_file_cut_inside_an_expert_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let first = model(dir.path());
    let f = GgufFile::open(&first).unwrap();
    let layout = ExpertLayout::from_gguf(&f).unwrap().unwrap();
    let r = ExpertReader::open(&paths(&f), &layout, IoMode::Buffered).unwrap();
    // Cut shard 2 inside layer 1's last down expert (its last tensor).
    let last = &layout.layer(1).unwrap().parts[2];
    let second = &paths(&f)[1];
    let cut = last.expert_offset(5) + 10;
    std::fs::OpenOptions::new()
        .write(true)
        .open(second)
        .unwrap()
        .set_len(cut)
        .unwrap();
    let mut slot = AlignedBuf::new(r.slot_bytes(1).unwrap());
    r.read(1, 4, slot.as_mut_slice()).unwrap();
    let err = r.read(1, 5, slot.as_mut_slice()).unwrap_err().to_string();
    assert!(
        err.starts_with(&format!(
            "layer 1, expert 5: reading blk.1.ffn_down_exps.weight at byte {} of ",
            last.expert_offset(5)
        )) && err.ends_with("short read: 10 of 256 bytes (the file ends early)"),
        "{err}"
    );
    // Ids outside the model are refused too.
    assert!(r.read(1, 6, slot.as_mut_slice()).is_err());
    assert!(r.read(7, 0, slot.as_mut_slice()).is_err());
}
