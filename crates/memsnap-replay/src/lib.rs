//! memsnap-replay
