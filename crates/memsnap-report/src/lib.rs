//! memsnap-report
