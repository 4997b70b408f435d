//! The identity file `lanefs.store` (docs/STORE.md, "The identity file"): the store's
//! format version and id, written once when the store is made.

use std::path::Path;

use crate::FORMAT_VERSION;
use crate::disk::Disk;
use crate::error::StoreError;
use crate::journal;
use crate::layout::{put, store_id_at, u32_at};

/// The identity file's name.
pub(crate) const IDENTITY: &str = "lanefs.store";
pub(crate) const IDENTITY_MAGIC: [u8; 8] = *b"LANEFSST";
/// The identity file's length.
pub(crate) const IDENTITY_LEN: usize = 64;

/// Where the identity file's fields are (docs/STORE.md, "The identity file"; `layout.rs`).
pub(crate) mod identity_at {
    use crate::layout::{STORE_ID as ID, U32};

    pub(crate) const MAGIC: usize = 0;
    pub(crate) const VERSION: usize = MAGIC + super::IDENTITY_MAGIC.len();
    pub(crate) const LEN: usize = VERSION + U32;
    pub(crate) const STORE_ID: usize = LEN + U32;
    /// Written as zeros.
    pub(crate) const RESERVED: usize = STORE_ID + ID;
    /// The CRC of the bytes before it.
    pub(crate) const CRC: usize = RESERVED + 28;
    const _: () = assert!(CRC + U32 == super::IDENTITY_LEN);
}
use identity_at as at;

/// The identity file's bytes for store `uuid` (docs/STORE.md, "The identity file").
pub(crate) fn encode_identity(uuid: &[u8; 16]) -> [u8; IDENTITY_LEN] {
    let mut b = [0u8; IDENTITY_LEN];
    put(&mut b, at::MAGIC, &IDENTITY_MAGIC);
    put(&mut b, at::VERSION, &FORMAT_VERSION.to_le_bytes());
    put(&mut b, at::LEN, &(IDENTITY_LEN as u32).to_le_bytes());
    put(&mut b, at::STORE_ID, uuid);
    let crc = crc32c::crc32c(&b[..at::CRC]);
    put(&mut b, at::CRC, &crc.to_le_bytes());
    b
}

/// The store id in the bytes `b` of the identity file at `p`, or why they are refused.
pub(crate) fn decode_identity(b: &[u8], p: &Path) -> Result<[u8; 16], StoreError> {
    if b.len() < IDENTITY_LEN || b[at::MAGIC..at::VERSION] != IDENTITY_MAGIC {
        return Err(StoreError::NotAStore {
            path: p.to_path_buf(),
            what: "bad identity file".into(),
        });
    }
    if crc32c::crc32c(&b[..at::CRC]) != u32_at(b, at::CRC) {
        return Err(StoreError::damaged(
            p,
            at::CRC as u64,
            "identity checksum mismatch",
        ));
    }
    let version = u32_at(b, at::VERSION);
    if version != FORMAT_VERSION {
        return Err(StoreError::damaged(
            p,
            at::VERSION as u64,
            format!("store format {version}, this lanefs reads {FORMAT_VERSION}"),
        ));
    }
    Ok(store_id_at(b, at::STORE_ID))
}

/// Refuses `dir` unless it is a directory holding a store's identity file, without
/// changing anything in it (so that `fsck` of an empty directory leaves it empty): the
/// error says what `dir` is instead.
pub(crate) fn existing_store(disk: &dyn Disk, dir: &Path) -> Result<(), StoreError> {
    let not = |what: &str| StoreError::NotAStore {
        path: dir.to_path_buf(),
        what: what.into(),
    };
    match disk.list(dir) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(not("no such directory"));
        }
        Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => {
            return Err(not("not a directory"));
        }
        Err(e) => return Err(StoreError::io(dir, "list")(e)),
    }
    if !disk.exists(&dir.join(IDENTITY)) {
        return Err(not(&format!("no {IDENTITY}")));
    }
    Ok(())
}

/// Reads the identity file, or (with `create`) writes it if the store is new; returns the
/// store's id and whether it was created.
pub(crate) fn identity(
    disk: &dyn Disk,
    dir: &Path,
    create: bool,
) -> Result<([u8; 16], bool), StoreError> {
    let p = dir.join(IDENTITY);
    if disk.exists(&p) {
        let f = disk.open(&p, false).map_err(StoreError::io(&p, "open"))?;
        let b = f.read_all().map_err(StoreError::io(&p, "read"))?;
        return decode_identity(&b, &p).map(|uuid| (uuid, false));
    }
    if !create {
        return Err(StoreError::NotAStore {
            path: dir.to_path_buf(),
            what: format!("no {IDENTITY}"),
        });
    }
    let jd = journal::dir(dir);
    if disk.exists(&jd)
        && !disk
            .list(&jd)
            .map_err(StoreError::io(&jd, "list"))?
            .is_empty()
    {
        return Err(StoreError::damaged(
            &p,
            0,
            "identity file missing, but the journal has segments",
        ));
    }
    let mut uuid = [0u8; 16];
    getrandom::fill(&mut uuid).map_err(|e| StoreError::Io {
        path: p.clone(),
        op: "make an id",
        source: std::io::Error::other(e.to_string()),
    })?;
    let b = encode_identity(&uuid);
    // Written under a temporary name and renamed, so that a crash never leaves a torn one.
    let tmp = dir.join("lanefs.store.tmp");
    let f = disk
        .open(&tmp, true)
        .map_err(StoreError::io(&tmp, "create"))?;
    f.set_len(0)
        .and_then(|()| f.write_at(&b, 0))
        .and_then(|()| f.sync_data())
        .map_err(StoreError::io(&tmp, "write"))?;
    disk.rename(&tmp, &p)
        .map_err(StoreError::io(&p, "rename"))?;
    disk.sync_dir(dir)
        .map_err(StoreError::io(dir, "flush directory"))?;
    Ok((uuid, true))
}
