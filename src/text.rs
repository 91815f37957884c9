//! Formatting shared by the text outputs: sizes, categories.

use memsnap_analysis::Category;

/// Bytes with a binary unit and two decimals (`20.00 MiB`), the one precision of every text
/// output.
pub fn fmt_bytes(b: u64) -> String {
    memsnap_model::format_bytes(b, 2)
}

pub fn category_title(c: Category) -> &'static str {
    match c {
        Category::PreTrace => "pre-trace (parameters, buffers)",
        Category::Gradients => "gradients",
        Category::OptimizerState => "optimizer state",
        Category::Activations => "activations",
        Category::Temporaries => "temporaries",
        Category::Other => "other long-lived",
    }
}
