//! thread pool
