//! What sandboxd keeps: its own state of sessions and tokens in SQLite ([`store`]), and the
//! audit log of workspace operations in SQLite or PostgreSQL ([`audit`]).

pub mod audit;
pub mod store;
