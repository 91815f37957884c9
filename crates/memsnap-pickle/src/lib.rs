//! Safe pickle reader (placeholder being written).
