//! Linux error numbers, the engine's only error type.
//!
//! Every engine operation returns `Result<T, Errno>` with the errno Linux tmpfs returns for the
//! same call, so the FUSE server passes it through unchanged and library users can convert it to
//! `std::io::Error` (which maps it to an `ErrorKind`).

use std::fmt;

/// A Linux `errno` value.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Errno(pub i32);

/// The engine's result type.
pub type Result<T> = std::result::Result<T, Errno>;

macro_rules! errnos {
    ($($name:ident),* $(,)?) => {
        impl Errno {
            $(
                #[doc = concat!("`", stringify!($name), "`")]
                pub const $name: Errno = Errno(libc::$name);
            )*

            /// The symbolic name (`"ENOENT"`), or `None` for a number this table lacks.
            pub fn name(self) -> Option<&'static str> {
                match self.0 {
                    $(libc::$name => Some(stringify!($name)),)*
                    _ => None,
                }
            }
        }
    };
}

errnos!(
    EPERM,
    ENOENT,
    EIO,
    EBADF,
    EAGAIN,
    ENOMEM,
    EACCES,
    EBUSY,
    EEXIST,
    EXDEV,
    ENODEV,
    ENXIO,
    ENOTDIR,
    EISDIR,
    EINVAL,
    ENFILE,
    EMFILE,
    EFBIG,
    ENOSPC,
    ESPIPE,
    EROFS,
    EMLINK,
    ERANGE,
    ENAMETOOLONG,
    ENOSYS,
    ENOTEMPTY,
    ELOOP,
    ENODATA,
    EOVERFLOW,
    EOPNOTSUPP,
    ESTALE,
    E2BIG,
    ETXTBSY,
    ENOTTY,
);

impl Errno {
    /// The raw number.
    pub fn code(self) -> i32 {
        self.0
    }
}

impl fmt::Debug for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => f.write_str(n),
            None => write!(f, "Errno({})", self.0),
        }
    }
}

impl fmt::Display for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let msg = std::io::Error::from_raw_os_error(self.0);
        match self.name() {
            Some(n) => write!(f, "{n} ({msg})"),
            None => write!(f, "{msg}"),
        }
    }
}

impl std::error::Error for Errno {}

impl From<Errno> for std::io::Error {
    fn from(e: Errno) -> Self {
        std::io::Error::from_raw_os_error(e.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_display() {
        assert_eq!(Errno::ENOENT.name(), Some("ENOENT"));
        assert_eq!(format!("{:?}", Errno::ENOTEMPTY), "ENOTEMPTY");
        assert!(
            Errno::EACCES
                .to_string()
                .starts_with("EACCES (Permission denied")
        );
        let io: std::io::Error = Errno::ENOENT.into();
        assert_eq!(io.kind(), std::io::ErrorKind::NotFound);
        assert_eq!(Errno(9999).name(), None);
    }
}
