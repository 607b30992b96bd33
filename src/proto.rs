//! Protocol core (in progress).
