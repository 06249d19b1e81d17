//! What every PNG chart of `analyze` and `bench` starts from: the font for its text and a white
//! canvas of a given size.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use plotters::coord::Shift;
use plotters::prelude::{BitMapBackend, DrawingArea, FontStyle, IntoDrawingArea, RGBColor, WHITE};

/// A chart's drawing area.
pub type Area<'a> = DrawingArea<BitMapBackend<'a>, Shift>;

/// The charts' colours, in the order their series take them.
pub const COLORS: [RGBColor; 3] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
];

/// Where common systems keep a sans-serif TrueType font.
const SYSTEM_FONTS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu-sans-fonts/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/liberation-sans/LiberationSans-Regular.ttf",
    "/usr/share/fonts/truetype/freefont/FreeSans.ttf",
    "/System/Library/Fonts/Supplemental/Arial.ttf",
    "/Library/Fonts/Arial.ttf",
    "C:\\Windows\\Fonts\\arial.ttf",
];

/// Reads the chart font: `explicit` (`--font`), else the first system font found. The bytes
/// live as long as the process (the plotting library keeps a registry of `'static` fonts); one
/// font per run.
pub fn load_font(explicit: Option<&Path>) -> Result<&'static [u8]> {
    let path = match explicit {
        Some(p) => p.to_path_buf(),
        None => SYSTEM_FONTS
            .iter()
            .map(PathBuf::from)
            .find(|p| p.is_file())
            .with_context(|| {
                format!(
                    "--png: no TrueType font for the chart's text (looked for {}); pass --font FILE.ttf",
                    SYSTEM_FONTS.join(", ")
                )
            })?,
    };
    let bytes = std::fs::read(&path).with_context(|| format!("reading font {}", path.display()))?;
    Ok(Box::leak(bytes.into_boxed_slice()))
}

/// A white PNG canvas of `size` pixels at `path`, its text in `font` (as "sans-serif").
pub fn canvas<'p>(path: &'p Path, size: (u32, u32), font: &'static [u8]) -> Result<Area<'p>> {
    plotters::style::register_font("sans-serif", FontStyle::Normal, font)
        .map_err(|_| anyhow::anyhow!("the font file is not a TrueType/OpenType font"))?;
    let root = BitMapBackend::new(path, size).into_drawing_area();
    root.fill(&WHITE)?;
    Ok(root)
}
