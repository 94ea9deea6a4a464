//! The error of the plugin block and of what it holds (the `rollout:` and `application:`
//! checks, the Application routes): one message naming the field and how to fix it.
//!
//! Its own module so that `block` and `observe`, which both return it, need not import each
//! other both ways (`docs/architecture.md` §2).

/// What is wrong with a block and how to fix it (one field, named).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BlockError(pub String);

/// `Err(BlockError(reason))`: the one way the checks fail.
pub(crate) fn fail<T>(reason: impl Into<String>) -> Result<T, BlockError> {
    Err(BlockError(reason.into()))
}
