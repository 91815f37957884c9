//! memsnap-analysis
