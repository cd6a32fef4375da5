//! The weight arena in a file that every oxillama process of the user
//! maps, so processes that run the same model on one machine share one
//! copy of its repacked matrices.
//!
//! Why: each process used to build its arena in private memory. Two
//! processes decoding SmolLM2 at once, one thread each, took 5.2 and 7.1
//! ms a step where one alone took 4.3 (two sessions in one process, which
//! share the arena: 3.9 each): the two copies compete for the caches and
//! the memory bus that one copy read by both would not. Ray replicas and
//! worker processes on one node also hold the arena once instead of once
//! each.
//!
//! The file lives in the page cache of a disk file system, not in
//! `/dev/shm`: shared memory gets huge pages only where the administrator
//! turned them on for it (rarely), while a regular file written in 2 MiB
//! pieces sits in 2 MiB folios that a 2 MiB-aligned mapping maps with one
//! TLB entry each (seen on ext4, Linux 6.18: every byte of a 100 MB file
//! PMD-mapped, in the writer and in a second process). Without them a
//! SmolLM2 step is 11% slower.
//!
//! Lifetime: a file is used only while some process holds it. Each user
//! holds a shared `flock` on it; the last one to let go (its model
//! dropped) finds the exclusive lock free and removes the file, and a
//! process that finds a file nobody holds (its users exited without
//! dropping the model) removes it. The name is a digest of everything the
//! bytes depend on: this build of the library, the model file's identity
//! (device, inode, size, modification and change times), the boot, the
//! arena's layout and the `OXILLAMA_*` settings; a file is written under
//! an anonymous name and linked in only when complete, so a name that
//! exists holds a whole arena of this boot. Anything that fails on the way
//! leaves the process with its private arena, as before.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// The alignment the file's mapping gets (a huge page on x86-64).
const HUGE: usize = 2 << 20;
const SUFFIX: &str = ".arena";

/// Where arena files go: `$OXILLAMA_ARENA_DIR`, else the user's cache
/// directory (`$XDG_CACHE_HOME` or `~/.cache`) under `oxillama/arenas`.
pub fn arena_dir() -> Option<PathBuf> {
    let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    if let Some(d) = var("OXILLAMA_ARENA_DIR") {
        return Some(PathBuf::from(d));
    }
    let cache = var("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| var("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(cache.join("oxillama").join("arenas"))
}

/// The path and identity of the shared library (or executable) this code
/// runs from: two builds of one version may lay their arenas out apart.
fn build_identity() -> Option<Vec<u8>> {
    let mut info = empty_dl_info();
    let here = build_identity as *const () as *const libc::c_void;
    // SAFETY: `here` is the address of a function of this object, and
    // `info` a valid, writable Dl_info; dladdr only fills it in.
    if unsafe { libc::dladdr(here, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dladdr succeeded and returned a NUL-terminated path it owns
    // for as long as the object is loaded (we copy it at once).
    let path = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) };
    let path = Path::new(std::ffi::OsStr::from_bytes(path.to_bytes()));
    let mut out = path.as_os_str().as_bytes().to_vec();
    out.extend(stat_identity(&std::fs::metadata(path).ok()?));
    Some(out)
}

fn empty_dl_info() -> libc::Dl_info {
    libc::Dl_info {
        dli_fname: std::ptr::null(),
        dli_fbase: std::ptr::null_mut(),
        dli_sname: std::ptr::null(),
        dli_saddr: std::ptr::null_mut(),
    }
}

/// Device, inode, size, and modification and change times: a file
/// rewritten in place changes its change time, one replaced its inode.
fn stat_identity(m: &std::fs::Metadata) -> Vec<u8> {
    use std::os::unix::fs::MetadataExt;
    [
        m.dev(),
        m.ino(),
        m.size(),
        m.mtime() as u64,
        m.mtime_nsec() as u64,
        m.ctime() as u64,
        m.ctime_nsec() as u64,
    ]
    .iter()
    .flat_map(|v| v.to_le_bytes())
    .collect()
}

/// The name of the arena file for a model file `model` whose arena lays
/// out `layout` (each matrix's tensor offset, length and kind, in order),
/// or None when something it depends on cannot be told.
pub fn arena_name(model: &File, layout: &[(usize, usize, u8)]) -> Option<String> {
    let boot = std::fs::read("/proc/sys/kernel/random/boot_id").ok()?;
    let mut h = blake3::Hasher::new();
    h.update(b"oxillama weight arena v1\0");
    h.update(env!("CARGO_PKG_VERSION").as_bytes());
    h.update(&build_identity()?);
    h.update(&boot);
    h.update(&stat_identity(&model.metadata().ok()?));
    for &(offset, len, held) in layout {
        h.update(&(offset as u64).to_le_bytes());
        h.update(&(len as u64).to_le_bytes());
        h.update(&[held]);
    }
    // Settings that choose kernels (and so layouts), read alike by both.
    let mut vars: Vec<(String, String)> = std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.to_string_lossy().into_owned())))
        .filter(|(k, _)| k.starts_with("OXILLAMA_"))
        .collect();
    vars.sort();
    for (k, v) in vars {
        h.update(k.as_bytes());
        h.update(b"=");
        h.update(v.as_bytes());
        h.update(b"\0");
    }
    Some(format!("{}{SUFFIX}", &h.finalize().to_hex()[..32]))
}

fn flock(f: &File, op: libc::c_int) -> bool {
    // SAFETY: flock on a descriptor this File owns.
    unsafe { libc::flock(f.as_raw_fd(), op) == 0 }
}

/// Whether `path` still names the inode `f` has open.
fn names(path: &Path, f: &File) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(path), f.metadata()) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// Removes `path` if no process holds it (the exclusive lock is free).
fn remove_if_unheld(path: &Path, f: &File) {
    if flock(f, libc::LOCK_EX | libc::LOCK_NB) && names(path, f) {
        let _ = std::fs::remove_file(path);
    }
}

/// Removes the arena files in `dir` that no process holds (their users
/// exited without dropping the model), but `keep`.
fn sweep(dir: &Path, keep: &str) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        if !name.ends_with(SUFFIX) || name == keep {
            continue;
        }
        if let Ok(f) = File::open(e.path()) {
            remove_if_unheld(&e.path(), &f);
        }
    }
}

/// An arena file mapped read-only at a 2 MiB boundary, held (shared lock)
/// until dropped; the last holder removes it.
pub struct SharedMap {
    /// The whole reservation (unmapped on drop), and the file's mapping in it.
    reserved: *mut libc::c_void,
    reserved_len: usize,
    data: *const u8,
    len: usize,
    file: File,
    path: PathBuf,
}

// SAFETY: the mapping is read-only and lives until drop; sharing
// references to its bytes across threads is like sharing a `&[u8]`.
unsafe impl Send for SharedMap {}
// SAFETY: as above.
unsafe impl Sync for SharedMap {}

impl SharedMap {
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `data..data + len` is the file's mapping, readable and
        // alive until drop; the file is never written once linked in (it is
        // written whole before it gets its name) nor truncated by us.
        unsafe { std::slice::from_raw_parts(self.data, self.len) }
    }

    /// Maps `file` (already holding a shared lock) whose length must be
    /// `len`.
    fn map(file: File, path: PathBuf, len: usize) -> Option<SharedMap> {
        if len == 0 || file.metadata().ok()?.len() != len as u64 {
            return None;
        }
        let reserved_len = len.checked_add(HUGE)?;
        // SAFETY: a fresh anonymous reservation, no address asked for.
        let reserved = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                reserved_len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if reserved == libc::MAP_FAILED {
            return None;
        }
        let aligned = (reserved as usize).next_multiple_of(HUGE);
        // SAFETY: `aligned..aligned + len` lies inside our reservation
        // (reserved_len = len + HUGE), so MAP_FIXED replaces only our own
        // pages; the file is `len` bytes long (checked above).
        let data = unsafe {
            libc::mmap(
                aligned as *mut libc::c_void,
                len,
                libc::PROT_READ,
                libc::MAP_SHARED | libc::MAP_FIXED | libc::MAP_POPULATE,
                file.as_raw_fd(),
                0,
            )
        };
        let out = SharedMap {
            reserved,
            reserved_len,
            data: data as *const u8,
            len,
            file,
            path,
        };
        if data == libc::MAP_FAILED {
            return None; // drop unmaps the reservation
        }
        // SAFETY: advice on our own mapping; only a hint.
        unsafe { libc::madvise(data, len, libc::MADV_HUGEPAGE) };
        Some(out)
    }
}

impl Drop for SharedMap {
    fn drop(&mut self) {
        // SAFETY: the reservation (with the file's mapping in it) is ours
        // and no reference into it outlives `self`.
        unsafe { libc::munmap(self.reserved, self.reserved_len) };
        remove_if_unheld(&self.path, &self.file);
    }
}

/// Whether `dir` is ours alone (owned by this user, writable by no one
/// else): a file another user could plant there would be mapped as our
/// weights.
fn private_dir(dir: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    std::fs::symlink_metadata(dir)
        .is_ok_and(|m| m.is_dir() && m.uid() == uid && m.mode() & 0o022 == 0)
}

/// Opens the arena file `name` in `dir` if a process made it this boot,
/// holding it; clears unheld leftovers of other arenas on the way.
pub fn open(dir: &Path, name: &str, len: usize) -> Option<SharedMap> {
    if !private_dir(dir) {
        return None;
    }
    sweep(dir, name);
    let path = dir.join(name);
    let file = File::open(&path).ok()?;
    if !flock(&file, libc::LOCK_SH) {
        return None;
    }
    SharedMap::map(file, path, len)
}

/// What became of a private arena handed to `publish`.
pub enum Published {
    /// It is in a shared file, mapped here.
    Shared(SharedMap),
    /// It stays private, every byte as it was.
    Kept,
    /// Publishing failed after pieces had left memory and they could not
    /// be read back: its bytes are no longer the arena.
    Lost,
}

/// Writes `bytes` (the private arena) as the arena file `name` in `dir`
/// and maps it; if another process linked its own first, maps that one.
/// Each written piece leaves this process's memory at once (the file's
/// pages hold it), so the arena is never resident twice: a peak of one
/// private copy and one mapped copy was Gemma-3's peak RSS + 277 MB. On
/// failure the pieces are read back from the file.
pub fn publish(dir: &Path, name: &str, bytes: &mut [u8]) -> Published {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    let made = std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir);
    if made.is_err() || !private_dir(dir) {
        return Published::Kept;
    }
    // Anonymous until complete: a crash leaves nothing behind.
    let Ok(file) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_TMPFILE)
        .open(dir)
    else {
        return Published::Kept;
    };
    let mut written = 0;
    let shared = write_and_link(&file, dir, name, bytes, &mut written);
    match shared {
        Some(linked) => Published::Shared(linked),
        None => restore(&file, &mut bytes[..written]),
    }
}

/// The body of `publish` once the file is open; `written` counts the bytes
/// that are in the file (and may have left memory).
fn write_and_link(
    file: &File,
    dir: &Path,
    name: &str,
    bytes: &mut [u8],
    written: &mut usize,
) -> Option<SharedMap> {
    use std::io::Write;
    // In 2 MiB writes, so the page cache holds them in 2 MiB folios.
    for piece in bytes.chunks_mut(HUGE) {
        (&*file).write_all(piece).ok()?;
        *written += piece.len();
        discard(piece);
    }
    if !flock(file, libc::LOCK_SH) {
        return None;
    }
    let path = dir.join(name);
    let proc_fd = std::ffi::CString::new(format!("/proc/self/fd/{}", file.as_raw_fd())).ok()?;
    let target = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: two NUL-terminated paths that outlive the call.
    let linked = unsafe {
        libc::linkat(
            libc::AT_FDCWD,
            proc_fd.as_ptr(),
            libc::AT_FDCWD,
            target.as_ptr(),
            libc::AT_SYMLINK_FOLLOW,
        )
    } == 0;
    if linked {
        return SharedMap::map(file.try_clone().ok()?, path, bytes.len());
    }
    // Another process made the same arena meanwhile: share theirs (ours,
    // never named, goes with our descriptor).
    if std::io::Error::last_os_error().raw_os_error() == Some(libc::EEXIST) {
        return open(dir, name, bytes.len());
    }
    None
}

/// Frees the whole pages inside `piece` (they read as zeros after): the
/// file holds them now.
fn discard(piece: &mut [u8]) {
    let ps = super::page_size();
    let start = (piece.as_ptr() as usize).next_multiple_of(ps);
    let end = (piece.as_ptr() as usize + piece.len()) / ps * ps;
    if end > start {
        // SAFETY: `start..end` are whole pages inside `piece`, memory we
        // hold exclusively (`&mut`); MADV_DONTNEED on private memory only
        // replaces them with zero pages, as writing zeros would.
        unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED) };
    }
}

/// Reads the written pieces back from the file after a failed publish.
fn restore(file: &File, written: &mut [u8]) -> Published {
    use std::os::unix::fs::FileExt;
    match file.read_exact_at(written, 0) {
        Ok(()) => Published::Kept,
        Err(_) => Published::Lost,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(tag: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("oxillama-arena-test-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn a_published_arena_is_shared_and_the_last_holder_removes_it() {
        use std::os::unix::fs::MetadataExt;
        let dir = temp_dir("share");
        let bytes: Vec<u8> = (0..3 * HUGE + 17).map(|i| (i % 251) as u8).collect();
        let shared = |b: &[u8]| match publish(&dir, "x.arena", &mut b.to_vec()) {
            Published::Shared(m) => m,
            _ => panic!("not published"),
        };
        let a = shared(&bytes);
        assert_eq!(a.bytes(), &bytes[..]);
        assert_eq!(a.bytes().as_ptr() as usize % HUGE, 0);
        let b = open(&dir, "x.arena", bytes.len()).expect("opened");
        assert_eq!(b.bytes(), &bytes[..]);
        // A second publisher of the same name maps the first one's file.
        let c = shared(&bytes);
        assert_eq!(
            c.file.metadata().unwrap().ino(),
            a.file.metadata().unwrap().ino()
        );
        // The wrong length is refused (a mapping past the end would fault).
        assert!(open(&dir, "x.arena", bytes.len() + 1).is_none());
        drop((a, c));
        assert!(dir.join("x.arena").exists(), "b still holds it");
        drop(b);
        assert!(!dir.join("x.arena").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn unheld_leftovers_are_swept_and_a_missing_file_is_none() {
        let dir = temp_dir("sweep");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("old.arena"), b"left by a process that exited").unwrap();
        std::fs::write(dir.join("notes.txt"), b"not ours").unwrap();
        assert!(open(&dir, "new.arena", 10).is_none());
        assert!(!dir.join("old.arena").exists());
        assert!(dir.join("notes.txt").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_name_depends_on_the_layout_and_the_file() {
        let dir = temp_dir("name");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("m1"), b"model one").unwrap();
        std::fs::write(dir.join("m2"), b"model two").unwrap();
        let (m1, m2) = (
            File::open(dir.join("m1")).unwrap(),
            File::open(dir.join("m2")).unwrap(),
        );
        let l = [(0usize, 100usize, 0u8), (4096, 5, 1)];
        let n = arena_name(&m1, &l).expect("a name on Linux");
        assert_eq!(arena_name(&m1, &l), Some(n.clone()));
        assert_ne!(arena_name(&m2, &l), Some(n.clone()));
        assert_ne!(arena_name(&m1, &l[..1]), Some(n.clone()));
        assert_ne!(arena_name(&m1, &[(0, 100, 1), (4096, 5, 1)]), Some(n));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn written_pieces_leave_memory_and_come_back_when_the_link_fails() {
        let dir = temp_dir("restore");
        std::fs::create_dir_all(&dir).unwrap();
        // Page-aligned private memory, as the arena's.
        let mut map = memmap2::MmapMut::map_anon(2 * HUGE).unwrap();
        for (i, b) in map.iter_mut().enumerate() {
            *b = (i % 253) as u8 + 1;
        }
        let want = map.to_vec();
        // A name that cannot be linked (a NUL): the link fails after every
        // piece was written and discarded.
        assert!(matches!(
            publish(&dir, "bad\0name", &mut map[..]),
            Published::Kept
        ));
        assert_eq!(&map[..], &want[..]);
        // Published: the private pages are gone (zero), the file holds them.
        match publish(&dir, "z.arena", &mut map[..]) {
            Published::Shared(m) => assert_eq!(m.bytes(), &want[..]),
            _ => panic!("not published"),
        }
        assert!(map.iter().all(|&b| b == 0));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_folder_others_may_write_is_not_used() {
        use std::os::unix::fs::PermissionsExt;
        let dir = temp_dir("open");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(matches!(
            publish(&dir, "y.arena", &mut [1, 2, 3]),
            Published::Kept
        ));
        assert!(std::fs::read_dir(&dir).unwrap().next().is_none());
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        assert!(matches!(
            publish(&dir, "y.arena", &mut [1, 2, 3]),
            Published::Shared(_)
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
