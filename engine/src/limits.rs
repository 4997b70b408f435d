//! The limits Linux puts on what a call may carry, which the engine checks and a record
//! carries within (a leaf: the operations, the xattr table, ACLs and the record codec all
//! read it).

/// Longest extended attribute name, prefix included (`XATTR_NAME_MAX`).
pub const XATTR_NAME_MAX: usize = 255;
/// Largest extended attribute value (`XATTR_SIZE_MAX`).
pub const XATTR_SIZE_MAX: usize = 65536;
/// Longest symlink target (`PATH_MAX` less the NUL), as tmpfs accepts.
pub const SYMLINK_MAX: usize = 4095;
