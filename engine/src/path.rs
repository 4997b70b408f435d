//! The path API: `std::fs`-style calls on a [`Filesystem`], for programs that embed lanefs.
//!
//! A [`Client`] is a filesystem plus the credentials and working directory of one caller, like
//! a process. Paths are bytes (anything `AsRef<Path>`); they resolve as Linux resolves them:
//! absolute or relative to the working directory, `.` and `..` physical, symlinks followed
//! (at most 40 per call, then ELOOP), a trailing slash requiring a directory. Errors are
//! `std::io::Error`s carrying the Linux errno (`raw_os_error()`).

use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;

use crossbeam_epoch::{self as epoch, Guard};

use crate::attr::{Attr, FileType, SetAttr, TimeSet};
use crate::errno::{Errno, Result};
use crate::fs::Filesystem;
use crate::fs::{InodeRef, TruncateBy};
use crate::handle::Fh;
use crate::id::{Ino, InodeId, ROOT_INO};
use crate::inode::Inode;
use crate::perm::Ctx;
use crate::time::Timespec;

/// Symlinks one resolution may follow (`MAXSYMLINKS`).
const MAX_SYMLINKS: u32 = 40;

/// Longest path (`PATH_MAX` less the NUL).
const PATH_MAX: usize = 4095;

fn bytes(p: &Path) -> &[u8] {
    p.as_os_str().as_bytes()
}

/// One caller of a filesystem: credentials and a working directory.
#[derive(Clone, Debug)]
pub struct Client {
    fs: Arc<Filesystem>,
    ctx: Ctx,
    cwd: InodeId,
}

/// Attributes of a file, as [`std::fs::Metadata`] gives them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Metadata {
    /// Everything `stat` reports.
    pub attr: Attr,
}

impl Metadata {
    /// Type.
    pub fn file_type(&self) -> FileType {
        self.attr.kind()
    }
    /// Whether it is a directory.
    pub fn is_dir(&self) -> bool {
        self.file_type() == FileType::Directory
    }
    /// Whether it is a regular file.
    pub fn is_file(&self) -> bool {
        self.file_type() == FileType::RegularFile
    }
    /// Whether it is a symlink (only from `symlink_metadata`).
    pub fn is_symlink(&self) -> bool {
        self.file_type() == FileType::Symlink
    }
    /// Size in bytes.
    pub fn len(&self) -> u64 {
        self.attr.size
    }
    /// Whether the size is 0.
    pub fn is_empty(&self) -> bool {
        self.attr.size == 0
    }
    /// `st_mode`.
    pub fn mode(&self) -> u32 {
        self.attr.mode
    }
    /// Inode number.
    pub fn ino(&self) -> Ino {
        self.attr.ino
    }
    /// When the file was made (as [`std::fs::Metadata::created`]); `None` if the store did not
    /// keep it ([`Attr::btime`]).
    pub fn created(&self) -> Option<std::time::SystemTime> {
        self.attr.btime.map(Into::into)
    }
}

/// An entry of [`Client::read_dir`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntryInfo {
    /// Name.
    pub name: Vec<u8>,
    /// Inode number.
    pub ino: Ino,
    /// Type.
    pub kind: FileType,
}

/// Options for [`Client::open`], as [`std::fs::OpenOptions`].
#[derive(Clone, Copy, Debug)]
pub struct OpenOptions {
    read: bool,
    write: bool,
    append: bool,
    truncate: bool,
    create: bool,
    create_new: bool,
    nofollow: bool,
    mode: u32,
    custom: i32,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions::new()
    }
}

impl OpenOptions {
    /// Nothing set; mode 0666 (less the umask) for created files.
    pub fn new() -> Self {
        OpenOptions {
            read: false,
            write: false,
            append: false,
            truncate: false,
            create: false,
            create_new: false,
            nofollow: false,
            mode: 0o666,
            custom: 0,
        }
    }
    /// Open for reading.
    pub fn read(&mut self, v: bool) -> &mut Self {
        self.read = v;
        self
    }
    /// Open for writing.
    pub fn write(&mut self, v: bool) -> &mut Self {
        self.write = v;
        self
    }
    /// Append (implies write).
    pub fn append(&mut self, v: bool) -> &mut Self {
        self.append = v;
        self
    }
    /// Truncate to 0 on open.
    pub fn truncate(&mut self, v: bool) -> &mut Self {
        self.truncate = v;
        self
    }
    /// Create if missing.
    pub fn create(&mut self, v: bool) -> &mut Self {
        self.create = v;
        self
    }
    /// Create, failing if it exists (`O_CREAT|O_EXCL`).
    pub fn create_new(&mut self, v: bool) -> &mut Self {
        self.create_new = v;
        self
    }
    /// Do not follow a symlink in the last component (`O_NOFOLLOW`).
    pub fn nofollow(&mut self, v: bool) -> &mut Self {
        self.nofollow = v;
        self
    }
    /// Extra `open(2)` flags (`O_DIRECTORY`, `O_NOATIME`, ...), as `OpenOptionsExt::custom_flags`.
    pub fn custom_flags(&mut self, flags: i32) -> &mut Self {
        self.custom = flags
            & !(libc::O_ACCMODE | libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC | libc::O_APPEND);
        self
    }
    /// Permission bits of a created file.
    pub fn mode(&mut self, mode: u32) -> &mut Self {
        self.mode = mode;
        self
    }

    fn flags(&self) -> i32 {
        let acc = match (self.read, self.write || self.append) {
            (true, true) => libc::O_RDWR,
            (false, true) => libc::O_WRONLY,
            _ => libc::O_RDONLY,
        };
        let mut f = acc | self.custom;
        if self.append {
            f |= libc::O_APPEND;
        }
        if self.truncate {
            f |= libc::O_TRUNC;
        }
        if self.create_new {
            f |= libc::O_EXCL;
        }
        f
    }
}

/// An open file of a [`Client`], which it borrows (so that opening a file takes no reference
/// on anything every thread shares). Closed (and, if unlinked, freed) when dropped.
#[derive(Debug)]
pub struct File<'c> {
    fs: &'c Filesystem,
    ctx: &'c Ctx,
    fh: Fh,
    ino: Ino,
    pos: u64,
    append: bool,
}

impl Client {
    /// A caller with credentials `ctx`, working in the root directory.
    pub fn new(fs: Arc<Filesystem>, ctx: Ctx) -> Self {
        Client {
            fs,
            ctx,
            cwd: InodeId::ROOT,
        }
    }

    /// A root caller.
    pub fn root(fs: Arc<Filesystem>) -> Self {
        Client::new(fs, Ctx::root())
    }

    /// The filesystem.
    pub fn fs(&self) -> &Arc<Filesystem> {
        &self.fs
    }

    /// The credentials.
    pub fn ctx(&self) -> &Ctx {
        &self.ctx
    }

    /// Resolution from the working directory, borrowing this client.
    fn here(&self) -> At<'_> {
        At::new(&self.fs, &self.ctx, self.cwd)
    }

    /// Changes the working directory (search permission needed, as `chdir`).
    pub fn set_current_dir(&mut self, path: impl AsRef<Path>) -> io::Result<()> {
        let g = epoch::pin();
        let here = self.here();
        let i = here.resolve(bytes(path.as_ref()), true, &g)?;
        if !i.is_dir() {
            return Err(Errno::ENOTDIR.into());
        }
        self.fs.may_search(&self.ctx, i)?;
        self.cwd = i.id();
        Ok(())
    }

    // ----- metadata ---------------------------------------------------------------------------

    /// Attributes, following symlinks.
    pub fn metadata(&self, path: impl AsRef<Path>) -> io::Result<Metadata> {
        let attr = self.here().stat(bytes(path.as_ref()), true)?;
        Ok(Metadata { attr })
    }

    /// Attributes of the path itself (a symlink is not followed).
    pub fn symlink_metadata(&self, path: impl AsRef<Path>) -> io::Result<Metadata> {
        let attr = self.here().stat(bytes(path.as_ref()), false)?;
        Ok(Metadata { attr })
    }

    /// Whether the path resolves.
    pub fn exists(&self, path: impl AsRef<Path>) -> bool {
        self.here().stat(bytes(path.as_ref()), true).is_ok()
    }

    /// `access(2)` with `R_OK`/`W_OK`/`X_OK` bits (or 0 for existence).
    pub fn access(&self, path: impl AsRef<Path>, mask: u32) -> io::Result<()> {
        Ok(self.here().access(bytes(path.as_ref()), mask)?)
    }

    /// Changes permission bits (`chmod`).
    pub fn set_permissions(&self, path: impl AsRef<Path>, mode: u32) -> io::Result<()> {
        self.set(
            path.as_ref(),
            SetAttr {
                mode: Some(mode),
                ..Default::default()
            },
        )
    }

    /// Changes owner and/or group (`chown`, following symlinks).
    pub fn chown(
        &self,
        path: impl AsRef<Path>,
        uid: Option<u32>,
        gid: Option<u32>,
    ) -> io::Result<()> {
        self.set(
            path.as_ref(),
            SetAttr {
                uid,
                gid,
                chown: true,
                ..Default::default()
            },
        )
    }

    /// Sets access and modification times (`utimensat`; `None` leaves a time unchanged).
    pub fn set_times(
        &self,
        path: impl AsRef<Path>,
        atime: Option<TimeSet>,
        mtime: Option<TimeSet>,
    ) -> io::Result<()> {
        self.set(
            path.as_ref(),
            SetAttr {
                atime,
                mtime,
                ..Default::default()
            },
        )
    }

    /// Sets the size (`truncate`).
    pub fn truncate(&self, path: impl AsRef<Path>, size: u64) -> io::Result<()> {
        self.set(
            path.as_ref(),
            SetAttr {
                size: Some(size),
                ..Default::default()
            },
        )
    }

    /// Changes attributes of what `path` names (symlinks followed).
    fn set(&self, path: &Path, set: SetAttr) -> io::Result<()> {
        self.here().setattr(bytes(path), true, &set)?;
        Ok(())
    }

    /// The inode flags (`lsattr`, following symlinks): see [`Filesystem::get_flags`].
    pub fn flags(&self, path: impl AsRef<Path>) -> io::Result<u32> {
        Ok(self
            .here()
            .on(bytes(path.as_ref()), true, |i, _| self.fs.get_flags(i.id()))?)
    }

    /// Sets the inode flags (`chattr`, following symlinks): see [`Filesystem::set_flags`].
    pub fn set_flags(&self, path: impl AsRef<Path>, flags: u32) -> io::Result<()> {
        Ok(self.here().on(bytes(path.as_ref()), true, |i, _| {
            self.fs.set_flags(&self.ctx, i.id(), flags).map(drop)
        })?)
    }

    // ----- namespace --------------------------------------------------------------------------

    /// Creates a directory with mode 0777 less the umask.
    pub fn create_dir(&self, path: impl AsRef<Path>) -> io::Result<()> {
        self.create_dir_mode(path, 0o777)
    }

    /// Creates a directory with the given mode (less the umask).
    pub fn create_dir_mode(&self, path: impl AsRef<Path>, mode: u32) -> io::Result<()> {
        self.here().mkdir(bytes(path.as_ref()), mode)?;
        Ok(())
    }

    /// Creates a directory and any missing parents.
    pub fn create_dir_all(&self, path: impl AsRef<Path>) -> io::Result<()> {
        let p = bytes(path.as_ref());
        let mut prefix = Vec::with_capacity(p.len());
        if p.starts_with(b"/") {
            prefix.push(b'/');
        }
        for c in components(p).collect::<Vec<_>>() {
            if !prefix.is_empty() && !prefix.ends_with(b"/") {
                prefix.push(b'/');
            }
            prefix.extend_from_slice(c);
            match self.create_dir(Path::new(std::ffi::OsStr::from_bytes(&prefix))) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                    if !self
                        .metadata(Path::new(std::ffi::OsStr::from_bytes(&prefix)))?
                        .is_dir()
                    {
                        return Err(Errno::ENOTDIR.into());
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Creates a node (FIFO, socket, device, or regular file): `mknod(2)`.
    pub fn mknod(&self, path: impl AsRef<Path>, mode: u32, rdev: u64) -> io::Result<()> {
        self.here().mknod(bytes(path.as_ref()), mode, rdev)?;
        Ok(())
    }

    /// Removes a file (not a directory).
    pub fn remove_file(&self, path: impl AsRef<Path>) -> io::Result<()> {
        Ok(self.here().unlink(bytes(path.as_ref()))?)
    }

    /// Removes an empty directory.
    pub fn remove_dir(&self, path: impl AsRef<Path>) -> io::Result<()> {
        Ok(self.here().rmdir(bytes(path.as_ref()))?)
    }

    /// Removes a directory and everything under it.
    pub fn remove_dir_all(&self, path: impl AsRef<Path>) -> io::Result<()> {
        let p = path.as_ref();
        for e in self.read_dir(p)? {
            let child = p.join(std::ffi::OsStr::from_bytes(&e.name));
            if e.kind == FileType::Directory {
                self.remove_dir_all(&child)?;
            } else {
                self.remove_file(&child)?;
            }
        }
        self.remove_dir(p)
    }

    /// Renames (`rename(2)`).
    pub fn rename(&self, from: impl AsRef<Path>, to: impl AsRef<Path>) -> io::Result<()> {
        self.rename_with_flags(from, to, 0)
    }

    /// Renames with `RENAME_NOREPLACE` or `RENAME_EXCHANGE` (`renameat2(2)`).
    pub fn rename_with_flags(
        &self,
        from: impl AsRef<Path>,
        to: impl AsRef<Path>,
        flags: u32,
    ) -> io::Result<()> {
        let here = self.here();
        here.rename(bytes(from.as_ref()), &here, bytes(to.as_ref()), flags)?;
        Ok(())
    }

    /// Creates a hard link `dst` to `src` (a symlink `src` is not followed, as `link(2)`).
    pub fn hard_link(&self, src: impl AsRef<Path>, dst: impl AsRef<Path>) -> io::Result<()> {
        let here = self.here();
        here.link(bytes(src.as_ref()), false, &here, bytes(dst.as_ref()))?;
        Ok(())
    }

    /// Creates a symlink at `link` pointing to `target`.
    pub fn symlink(&self, target: impl AsRef<Path>, link: impl AsRef<Path>) -> io::Result<()> {
        self.here()
            .symlink(bytes(target.as_ref()), bytes(link.as_ref()))?;
        Ok(())
    }

    /// The target of a symlink.
    pub fn read_link(&self, path: impl AsRef<Path>) -> io::Result<Vec<u8>> {
        Ok(self.here().readlink(bytes(path.as_ref()))?)
    }

    /// The entries of a directory, `.` and `..` left out, in readdir order.
    pub fn read_dir(&self, path: impl AsRef<Path>) -> io::Result<Vec<DirEntryInfo>> {
        let fh = self.here().on(bytes(path.as_ref()), true, |i, _| {
            self.fs.opendir(&self.ctx, i.id())
        })?;
        let mut out = Vec::new();
        let r = self.fs.readdir(&self.ctx, fh, 0, false, |e, _| {
            if e.name != b"." && e.name != b".." {
                out.push(DirEntryInfo {
                    name: e.name.to_vec(),
                    ino: e.ino,
                    kind: e.kind,
                });
            }
            true
        });
        self.fs.releasedir(fh)?;
        r?;
        Ok(out)
    }

    // ----- contents ---------------------------------------------------------------------------

    /// Opens a file.
    pub fn open(&self, path: impl AsRef<Path>, opts: &OpenOptions) -> io::Result<File<'_>> {
        let flags = opts.flags();
        let mut links = 0u32;
        let g = epoch::pin();
        let here = self.here();
        let mut from = InodeRef::from(self.cwd);
        let mut p: &[u8] = bytes(path.as_ref());
        let mut retries = 0;
        loop {
            let (dir, name, slash) = here.resolve_parent_from(from, p, &mut links, &g)?;
            // Creating first saves a lookup of a new name; an existing one (EEXIST, reported
            // before any write-permission check, as open(O_CREAT) of an existing file needs)
            // is looked up and opened below, following a symlink.
            if (opts.create || opts.create_new) && !slash && name != b"." && name != b".." {
                let excl = flags | libc::O_EXCL;
                match self.fs.create(&self.ctx, dir.id(), name, opts.mode, excl) {
                    Ok((a, fh)) => return Ok(self.file(fh, a.ino, opts)),
                    Err(Errno::EEXIST) if !opts.create_new => {}
                    Err(e) => return Err(e.into()),
                }
            }
            match self.fs.step(&self.ctx, dir, name, &g) {
                Ok(i) => match self.fs.symlink_target(i) {
                    Some(target) if !opts.nofollow && !opts.create_new => {
                        self.fs.may_follow(&self.ctx, dir, i)?;
                        links += 1;
                        if links > MAX_SYMLINKS {
                            return Err(Errno::ELOOP.into());
                        }
                        p = target;
                        from = dir.id().into();
                    }
                    target => {
                        if opts.create_new {
                            return Err(Errno::EEXIST.into());
                        }
                        if target.is_some() {
                            return Err(Errno::ELOOP.into());
                        }
                        if slash && !i.is_dir() {
                            return Err(Errno::ENOTDIR.into());
                        }
                        match self.fs.open(&self.ctx, i.id(), flags) {
                            Ok(fh) => return Ok(self.file(fh, i.ino, opts)),
                            // Freed since the walk found it: a rename pointed the name at
                            // another inode, or removed it. Walk again (a few times at most).
                            Err(Errno::ENOENT) if i.is_dead() && retries < 8 => retries += 1,
                            Err(e) => return Err(e.into()),
                        }
                    }
                },
                Err(Errno::ENOENT) if opts.create || opts.create_new => {
                    if slash {
                        return Err(Errno::EISDIR.into());
                    }
                    let (a, fh) = self
                        .fs
                        .create(&self.ctx, dir.id(), name, opts.mode, flags)?;
                    return Ok(self.file(fh, a.ino, opts));
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// `open(dir, O_TMPFILE)`: a new regular file with no name, made in directory `dir`
    /// ([`Filesystem::tmpfile`]); `opts` gives its access mode (it must allow writing), its
    /// permission bits, and with [`OpenOptions::create_new`] `O_EXCL`: the file can never be
    /// given a name. [`Client::link_file`] gives it one; if nothing does, it is freed when
    /// closed.
    pub fn open_tmpfile(&self, dir: impl AsRef<Path>, opts: &OpenOptions) -> io::Result<File<'_>> {
        let (a, fh) = self.here().on(bytes(dir.as_ref()), true, |i, _| {
            self.fs.tmpfile(&self.ctx, i.id(), opts.mode, opts.flags())
        })?;
        Ok(self.file(fh, a.ino, opts))
    }

    /// `linkat(fd, "", AT_FDCWD, dst, AT_EMPTY_PATH)`: gives the open file `f` the name `dst`
    /// (a second one, or an [`Client::open_tmpfile`] file's first; ENOENT for a file whose
    /// last name is gone).
    pub fn link_file(&self, f: &File<'_>, dst: impl AsRef<Path>) -> io::Result<()> {
        let g = epoch::pin();
        let (dir, name, slash) = self.here().resolve_parent(bytes(dst.as_ref()), &g)?;
        if slash {
            return Err(Errno::ENOENT.into());
        }
        self.fs.link(&self.ctx, f.ino, dir.id(), name)?;
        Ok(())
    }

    fn file(&self, fh: Fh, ino: Ino, opts: &OpenOptions) -> File<'_> {
        File {
            fs: &self.fs,
            ctx: &self.ctx,
            fh,
            ino,
            pos: 0,
            append: opts.append,
        }
    }

    /// Creates or truncates a file and writes `data` to it.
    pub fn write(&self, path: impl AsRef<Path>, data: impl AsRef<[u8]>) -> io::Result<()> {
        let mut f = self.open(
            path,
            OpenOptions::new().write(true).create(true).truncate(true),
        )?;
        f.write_all(data.as_ref())
    }

    /// Reads a whole file.
    pub fn read(&self, path: impl AsRef<Path>) -> io::Result<Vec<u8>> {
        let mut f = self.open(path, OpenOptions::new().read(true))?;
        let mut v = Vec::new();
        f.read_to_end(&mut v)?;
        Ok(v)
    }

    /// Reads a whole file as UTF-8.
    pub fn read_to_string(&self, path: impl AsRef<Path>) -> io::Result<String> {
        String::from_utf8(self.read(path)?)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
    }
}

/// Paths resolved from one directory with one caller's credentials: what a [`Client`] does
/// for each of its calls, borrowed (it takes no reference count, so it costs nothing to
/// make), for a server resolving paths for many callers at once: the channel of `lanefs
/// run` makes one per request, at the directory its caller's path starts from. Errors are
/// [`Errno`]s.
///
/// **Confined** ([`At::confined`]): the filesystem is mounted inside a larger tree whose
/// root is not its own. An absolute path, an absolute symlink target, and `..` from the
/// filesystem's root then lead out of it: a resolution that meets one fails with EXDEV (which
/// lanefs gives for nothing else), so that its caller resolves that path itself, through
/// the kernel.
#[derive(Clone, Copy, Debug)]
pub struct At<'a> {
    fs: &'a Filesystem,
    ctx: &'a Ctx,
    cwd: InodeRef,
    confined: bool,
}

impl<'a> At<'a> {
    /// Resolution from directory `cwd` (relative paths start there) for caller `ctx`.
    pub fn new(fs: &'a Filesystem, ctx: &'a Ctx, cwd: impl Into<InodeRef>) -> Self {
        At {
            fs,
            ctx,
            cwd: cwd.into(),
            confined: false,
        }
    }

    /// The same, for a filesystem mounted inside a larger tree (see the type's doc).
    pub fn confined(mut self) -> Self {
        self.confined = true;
        self
    }

    /// The same caller and mode, from directory `cwd`.
    pub fn from_dir(self, cwd: impl Into<InodeRef>) -> Self {
        At {
            cwd: cwd.into(),
            ..self
        }
    }

    // ----- resolution -------------------------------------------------------------------------
    //
    // A walk holds one epoch guard and steps from inode to inode (`Filesystem::step`: one
    // dirent-map shard read lock per component, no attributes built). Operations then name
    // the inodes it found by number and generation, so one removed meanwhile is ENOENT, never
    // the inode that took its number.

    /// Where a path starts: the root, or the working directory (ENOENT once removed).
    fn start<'g>(&self, path: &[u8], from: InodeRef, g: &'g Guard) -> Result<&'g Inode> {
        if path.first() == Some(&b'/') {
            if self.confined {
                return Err(Errno::EXDEV);
            }
            return self.fs.iget(InodeId::ROOT, g);
        }
        self.fs.iget(from, g)
    }

    /// One step from directory `dir` to `name`; EXDEV for `..` from the root when confined.
    fn step<'g>(&self, dir: &'g Inode, name: &[u8], g: &'g Guard) -> Result<&'g Inode> {
        if self.confined && name == b".." && dir.ino == ROOT_INO {
            return Err(Errno::EXDEV);
        }
        self.fs.step(self.ctx, dir, name, g)
    }

    /// Resolves `comps` from directory `start`; symlinks in the last component are followed
    /// when `follow_last`.
    fn walk<'g>(
        &self,
        start: &'g Inode,
        mut comps: Components<'_>,
        follow_last: bool,
        links: &mut u32,
        g: &'g Guard,
    ) -> Result<&'g Inode> {
        let mut cur = start;
        while let Some(c) = comps.next() {
            let dir = cur;
            let next = self.step(dir, c, g)?;
            let last = comps.is_done();
            cur = match self.fs.symlink_target(next) {
                Some(target) if !last || follow_last => {
                    self.fs.may_follow(self.ctx, dir, next)?;
                    *links += 1;
                    if *links > MAX_SYMLINKS {
                        return Err(Errno::ELOOP);
                    }
                    self.walk_path(dir.id().into(), target, true, links, g)?
                }
                _ => next,
            };
        }
        Ok(cur)
    }

    fn walk_path<'g>(
        &self,
        from: InodeRef,
        path: &[u8],
        follow_last: bool,
        links: &mut u32,
        g: &'g Guard,
    ) -> Result<&'g Inode> {
        if path.is_empty() {
            return Err(Errno::ENOENT);
        }
        if path.len() > PATH_MAX {
            return Err(Errno::ENAMETOOLONG);
        }
        let start = self.start(path, from, g)?;
        let comps = components(path);
        let trailing = path.ends_with(b"/") && !comps.is_done();
        let i = self.walk(start, comps, follow_last || trailing, links, g)?;
        if trailing && !i.is_dir() {
            return Err(Errno::ENOTDIR);
        }
        Ok(i)
    }

    pub(crate) fn resolve<'g>(
        &self,
        path: &[u8],
        follow_last: bool,
        g: &'g Guard,
    ) -> Result<&'g Inode> {
        self.walk_path(self.cwd, path, follow_last, &mut 0, g)
    }

    /// Resolves all but the last component: the directory and the last name. A trailing slash
    /// is reported so that callers can require a directory.
    pub(crate) fn resolve_parent<'g, 'p>(
        &self,
        path: &'p [u8],
        g: &'g Guard,
    ) -> Result<(&'g Inode, &'p [u8], bool)> {
        self.resolve_parent_from(self.cwd, path, &mut 0, g)
    }

    pub(crate) fn resolve_parent_from<'g, 'p>(
        &self,
        from: InodeRef,
        path: &'p [u8],
        links: &mut u32,
        g: &'g Guard,
    ) -> Result<(&'g Inode, &'p [u8], bool)> {
        if path.is_empty() {
            return Err(Errno::ENOENT);
        }
        if path.len() > PATH_MAX {
            return Err(Errno::ENAMETOOLONG);
        }
        let start = self.start(path, from, g)?;
        let trailing = path.ends_with(b"/");
        let Some((init, last)) = split_last(path) else {
            return Ok((start, b".", true)); // "/" names the root itself
        };
        let dir = self.walk(start, init, true, links, g)?;
        if !dir.is_dir() {
            return Err(Errno::ENOTDIR);
        }
        if self.confined && last == b".." && dir.ino == ROOT_INO {
            return Err(Errno::EXDEV);
        }
        // The walk checks search permission on the last directory too (may_lookup), before
        // the operation looks at the name.
        self.fs.may_search(self.ctx, dir)?;
        if last.len() > crate::dir::NAME_MAX {
            return Err(Errno::ENAMETOOLONG);
        }
        Ok((dir, last, trailing))
    }

    /// Resolves `path` and applies `f` to what it names. When `f` fails with ENOENT because
    /// that inode was freed after the walk found it (a rename pointed the name at another
    /// inode, or removed it), the path is resolved again, a few times at most.
    pub(crate) fn on<T>(
        &self,
        path: &[u8],
        follow: bool,
        mut f: impl FnMut(&Inode, &Guard) -> Result<T>,
    ) -> Result<T> {
        let g = epoch::pin();
        let mut tries = 0;
        loop {
            let i = self.resolve(path, follow, &g)?;
            match f(i, &g) {
                Err(Errno::ENOENT) if i.is_dead() && tries < 8 => tries += 1,
                r => return r,
            }
        }
    }

    // ----- operations -------------------------------------------------------------------------

    /// Attributes of what `path` names (`stat`; `lstat` when not `follow`).
    pub fn stat(&self, path: &[u8], follow: bool) -> Result<Attr> {
        self.on(path, follow, |i, g| Ok(self.fs.attr_of(i, g)))
    }

    /// `access(2)` with `R_OK`/`W_OK`/`X_OK` bits (or 0 for existence).
    pub fn access(&self, path: &[u8], mask: u32) -> Result<()> {
        self.on(path, true, |i, _| self.fs.access(self.ctx, i.id(), mask))
    }

    /// Changes attributes of what `path` names ([`Filesystem::setattr`]'s checks).
    pub fn setattr(&self, path: &[u8], follow: bool, set: &SetAttr) -> Result<Attr> {
        self.on(path, follow, |i, _| {
            self.fs.setattr(self.ctx, i.id(), set, None)
        })
    }

    /// Creates a directory with `mode` (less the umask or the default ACL).
    pub fn mkdir(&self, path: &[u8], mode: u32) -> Result<Attr> {
        let g = epoch::pin();
        let (dir, name, _) = self.resolve_parent(path, &g)?;
        self.fs.mkdir(self.ctx, dir.id(), name, mode)
    }

    /// Creates a node (FIFO, socket, device, or regular file): `mknod(2)`.
    pub fn mknod(&self, path: &[u8], mode: u32, rdev: u64) -> Result<Attr> {
        let g = epoch::pin();
        let (dir, name, slash) = self.resolve_parent(path, &g)?;
        if slash {
            return Err(Errno::ENOENT);
        }
        self.fs.mknod(self.ctx, dir.id(), name, mode, rdev)
    }

    /// Removes a file (not a directory).
    pub fn unlink(&self, path: &[u8]) -> Result<()> {
        let g = epoch::pin();
        let (dir, name, slash) = self.resolve_parent(path, &g)?;
        if slash {
            // "file/" names a directory that must exist: Linux answers EISDIR or ENOTDIR.
            let a = self.fs.lookup(self.ctx, dir.id(), name)?;
            return Err(if a.kind() == FileType::Directory {
                Errno::EISDIR
            } else {
                Errno::ENOTDIR
            });
        }
        self.fs.unlink(self.ctx, dir.id(), name)
    }

    /// Removes an empty directory.
    pub fn rmdir(&self, path: &[u8]) -> Result<()> {
        let g = epoch::pin();
        let (dir, name, _) = self.resolve_parent(path, &g)?;
        if dir.ino == ROOT_INO && name == b"." && components(path).is_done() {
            return Err(Errno::EBUSY);
        }
        self.fs.rmdir(self.ctx, dir.id(), name)
    }

    /// Renames `from` to `to`, resolved from `dest`'s directory (the same caller), with
    /// `RENAME_NOREPLACE` or `RENAME_EXCHANGE` in `flags` (`renameat2(2)`).
    pub fn rename(&self, from: &[u8], dest: &At<'_>, to: &[u8], flags: u32) -> Result<()> {
        let g = epoch::pin();
        let (d1, n1, slash1) = self.resolve_parent(from, &g)?;
        // Within one directory named the same way (the common rename), walk it once.
        let same_parent = self.cwd == dest.cwd
            && from.starts_with(b"/") == to.starts_with(b"/")
            && parent_text(from).is_some_and(|p| Some(p) == parent_text(to));
        let (d2, n2, slash2) = if same_parent {
            let (n2, slash2) = last_component(to).ok_or(Errno::ENOENT)?;
            if n2.len() > crate::dir::NAME_MAX {
                return Err(Errno::ENAMETOOLONG);
            }
            (d1, n2, slash2)
        } else {
            dest.resolve_parent(to, &g)?
        };
        if slash1 || slash2 {
            // A trailing slash is allowed only on directories.
            let a = self.fs.lookup(self.ctx, d1.id(), n1)?;
            if a.kind() != FileType::Directory {
                return Err(Errno::ENOTDIR);
            }
        }
        self.fs.rename(self.ctx, d1.id(), n1, d2.id(), n2, flags)
    }

    /// Creates a hard link `dst` (resolved from `dest`'s directory) to `src` (a symlink is
    /// followed only when `follow`, as `linkat(AT_SYMLINK_FOLLOW)`).
    pub fn link(&self, src: &[u8], follow: bool, dest: &At<'_>, dst: &[u8]) -> Result<Attr> {
        let g = epoch::pin();
        let i = self.resolve(src, follow, &g)?;
        let (dir, name, slash) = dest.resolve_parent(dst, &g)?;
        if slash {
            return Err(if i.is_dir() {
                Errno::EPERM
            } else {
                Errno::ENOENT
            });
        }
        self.fs.link(self.ctx, i.id(), dir.id(), name)
    }

    /// Creates a symlink at `link` pointing to `target`.
    pub fn symlink(&self, target: &[u8], link: &[u8]) -> Result<Attr> {
        let g = epoch::pin();
        let (dir, name, slash) = self.resolve_parent(link, &g)?;
        if slash {
            return Err(Errno::ENOENT);
        }
        self.fs.symlink(self.ctx, dir.id(), name, target)
    }

    /// The target of a symlink.
    pub fn readlink(&self, path: &[u8]) -> Result<Vec<u8>> {
        self.on(path, false, |i, _| self.fs.readlink(i.id()))
    }
}

/// The text before a path's last component, when that component names an entry (not `.` or
/// `..`). Two paths with the same parent text name the same directory at any one moment, so
/// a rename resolves it once for both (as if it resolved both at the same instant; Linux
/// resolves them one after the other, which is no more atomic).
fn parent_text(path: &[u8]) -> Option<&[u8]> {
    let trimmed = path.strip_suffix(b"/").unwrap_or(path);
    let cut = trimmed.iter().rposition(|&b| b == b'/')?;
    let last = &trimmed[cut + 1..];
    (!last.is_empty() && last != b"." && last != b"..").then_some(&trimmed[..cut])
}

/// The last component of a path that has a parent text, and whether a slash follows it.
fn last_component(path: &[u8]) -> Option<(&[u8], bool)> {
    let slash = path.ends_with(b"/");
    let trimmed = path.strip_suffix(b"/").unwrap_or(path);
    let cut = trimmed.iter().rposition(|&b| b == b'/')?;
    Some((&trimmed[cut + 1..], slash))
}

/// A path's components, empty ones and `.` left out except a final `.` (which names the
/// directory itself and matters to mkdir, rmdir and rename errors). Split as they are walked,
/// with nothing allocated.
#[derive(Clone, Copy)]
struct Components<'a> {
    path: &'a [u8],
    at: usize,
    /// Whether a final `.` is a component (false for the directory part of a path, whose
    /// last component is not the path's).
    keep_final_dot: bool,
}

fn components(path: &[u8]) -> Components<'_> {
    Components {
        path,
        at: 0,
        keep_final_dot: true,
    }
}

/// The directory part of a path and its last component, if it has one.
fn split_last(path: &[u8]) -> Option<(Components<'_>, &[u8])> {
    let mut comps = components(path);
    let mut last = comps.next()?;
    let mut before = 0;
    for c in comps {
        before = last.as_ptr() as usize - path.as_ptr() as usize + last.len();
        last = c;
    }
    let init = Components {
        path: &path[..before],
        at: 0,
        keep_final_dot: false,
    };
    Some((init, last))
}

impl Components<'_> {
    /// Whether no component is left.
    fn is_done(&self) -> bool {
        self.clone().next().is_none()
    }
}

impl<'a> Iterator for Components<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        let p = self.path;
        loop {
            while self.at < p.len() && p[self.at] == b'/' {
                self.at += 1;
            }
            if self.at >= p.len() {
                return None;
            }
            let start = self.at;
            while self.at < p.len() && p[self.at] != b'/' {
                self.at += 1;
            }
            let c = &p[start..self.at];
            let more = p[self.at..].iter().any(|&b| b != b'/');
            if c == b"." && (more || !self.keep_final_dot) {
                continue;
            }
            return Some(c);
        }
    }
}

impl File<'_> {
    /// The file's inode number.
    pub fn ino(&self) -> Ino {
        self.ino
    }

    /// The engine handle (for the inode API).
    pub fn handle(&self) -> Fh {
        self.fh
    }

    /// Attributes.
    pub fn metadata(&self) -> io::Result<Metadata> {
        Ok(Metadata {
            attr: self.fs.getattr(self.ino)?,
        })
    }

    /// Sets the size (`ftruncate`).
    pub fn set_len(&self, size: u64) -> io::Result<()> {
        let mt = Some(TimeSet::Now);
        let set = SetAttr {
            size: Some(size),
            mtime: mt,
            ctime: Some(Timespec::now()),
            ..Default::default()
        };
        self.fs
            .setattr(self.ctx, self.ino, &set, Some(TruncateBy::Handle(self.fh)))?;
        Ok(())
    }

    /// `fsync`.
    pub fn sync_all(&self) -> io::Result<()> {
        Ok(self.fs.fsync(self.fh, false)?)
    }

    /// Reads at an offset without moving the position (`pread`).
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        Ok(self.fs.read(self.fh, offset, buf)?)
    }

    /// Writes at an offset without moving the position (`pwrite`).
    pub fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize> {
        Ok(self.fs.write(self.ctx, self.fh, offset, buf)?)
    }
}

impl Read for File<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.fs.read(self.fh, self.pos, buf)?;
        self.pos += n as u64;
        Ok(n)
    }
}

impl Write for File<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.fs.write(self.ctx, self.fh, self.pos, buf)?;
        self.pos = if self.append {
            self.fs.getattr(self.ino)?.size
        } else {
            self.pos + n as u64
        };
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(self.fs.flush(self.fh)?)
    }
}

impl Seek for File<'_> {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        let base = match to {
            SeekFrom::Start(o) => Some(o),
            SeekFrom::Current(d) => self.pos.checked_add_signed(d),
            SeekFrom::End(d) => self.fs.getattr(self.ino)?.size.checked_add_signed(d),
        };
        self.pos = base.ok_or_else(|| io::Error::from(Errno::EINVAL))?;
        Ok(self.pos)
    }
}

impl Drop for File<'_> {
    fn drop(&mut self) {
        let _ = self.fs.release(self.fh);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn components_keep_only_a_final_dot() {
        let all = |p| components(p).collect::<Vec<_>>();
        assert_eq!(all(b"/a//b/./c/"), vec![&b"a"[..], b"b", b"c"]);
        assert_eq!(all(b"a/."), vec![&b"a"[..], b"."]);
        assert_eq!(all(b"./a"), vec![&b"a"[..]]);
        assert!(components(b"/").is_done());
        assert_eq!(all(b"a/../b"), vec![&b"a"[..], b"..", b"b"]);
        let (init, last) = split_last(b"/a/./b/").unwrap();
        assert_eq!(
            (init.collect::<Vec<_>>(), last),
            (vec![&b"a"[..]], &b"b"[..])
        );
        let (init, last) = split_last(b"a/b/.").unwrap();
        assert_eq!(
            (init.collect::<Vec<_>>(), last),
            (vec![&b"a"[..], b"b"], &b"."[..])
        );
        let (init, last) = split_last(b"a/./.").unwrap();
        assert_eq!(
            (init.collect::<Vec<_>>(), last),
            (vec![&b"a"[..]], &b"."[..])
        );
        assert!(split_last(b"//").is_none());
    }
}
