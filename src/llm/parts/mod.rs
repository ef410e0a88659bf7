//! Message parts beyond text: images and PDF documents, as stored, as each provider
//! takes them, and as each provider counts them.
//!
//! A part carried as data is measured when the job is created (an image by the size
//! in its header, a PDF by its pages), so its tokens are known before anything is
//! held. A part given by URL cannot be measured without fetching it: an image is
//! counted at the most the provider counts any image, and a document by URL is
//! refused, since nothing bounds its pages.

pub mod image;
pub mod pdf;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

pub use image::ImageFormat;

/// What a PDF page counts as, for both providers, on top of its text: the image of
/// the page each provider reads beside the text.
pub const TOKENS_PER_PDF_PAGE: u64 = 3_000;
/// The media type of the only documents taken.
pub const PDF_MEDIA_TYPE: &str = "application/pdf";

/// One part of a message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Part {
    Text {
        text: String,
    },
    Image {
        source: Source,
        /// Width and height in pixels, read from the header; `None` for a URL.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        size: Option<(u32, u32)>,
    },
    /// A PDF, carried as data.
    Document {
        source: Source,
        pages: u32,
        /// A bound of the tokens of the text it shows ([`pdf::Measure`]). Documents
        /// stored before it was measured have none.
        #[serde(default)]
        text_tokens: u64,
    },
}

/// Where a part's bytes are.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Source {
    Base64 { media_type: String, data: String },
    Url { url: String },
}

/// The request shape a provider speaks, which also decides how it counts media.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// OpenAI's chat completions (and the simulator's, in that shape).
    OpenAi,
    /// Anthropic's messages.
    Anthropic,
}

/// Which parts beyond text a model takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MediaInput {
    pub images: bool,
    pub documents: bool,
}

impl MediaInput {
    /// What `model` takes, by its name: OpenAI's and Anthropic's models with vision
    /// take images, and PDFs where the provider reads them; any other model, text
    /// only (a model unknown here may take nothing else).
    pub fn of_model(model: &str) -> Self {
        let name = model.strip_prefix("ft:").unwrap_or(model);
        let text_only = Self {
            images: false,
            documents: false,
        };
        let both = Self {
            images: true,
            documents: true,
        };
        let vision = [
            "gpt-4o",
            "chatgpt-4o",
            "gpt-4.1",
            "gpt-4.5",
            "gpt-5",
            "gpt-4-turbo",
            "o1",
            "o3",
            "o4",
        ];
        // Reasoning models of the first generations read text only.
        let text_models = ["o1-mini", "o1-preview", "o3-mini"];
        if text_models.iter().any(|prefix| name.starts_with(prefix)) {
            return text_only;
        }
        if vision.iter().any(|prefix| name.starts_with(prefix)) {
            return both;
        }
        if let Some(claude) = name.strip_prefix("claude-") {
            // Claude 3 reads images; PDFs came with 3.5 Sonnet and every model after.
            if claude.starts_with("3-opus")
                || claude.starts_with("3-sonnet")
                || claude.starts_with("3-haiku")
            {
                return Self {
                    images: true,
                    documents: false,
                };
            }
            if claude.starts_with("2") || claude.starts_with("instant") {
                return text_only;
            }
            return both;
        }
        text_only
    }
}

/// How an OpenAI model counts an image at high detail, by the model (OpenAI's vision
/// pricing differs by model family, up to 30-fold for the same picture).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum OpenAiImages {
    /// Fitted in 2048 × 2048, its shortest side brought down to 768, then `base`
    /// tokens and `per_tile` for each 512-pixel tile.
    Tiles { base: u64, per_tile: u64 },
    /// One token per 32-pixel patch, at most 1,536 patches (a larger image is scaled
    /// down to fit), times `per_thousand` / 1000.
    Patches { per_thousand: u64 },
}

/// The most patches an image of the patch rule is scaled down to.
const MAX_PATCHES: u64 = 1536;

impl OpenAiImages {
    /// The rule of `model`. A model not named here — a fine-tune's base unknown, an
    /// OpenAI-compatible server's own model — counts by the dearest rule, so that a
    /// hold is never short of what an OpenAI model would bill.
    fn of_model(model: &str) -> Self {
        let name = model.strip_prefix("ft:").unwrap_or(model);
        let rules: [(&str, Self); 12] = [
            (
                "gpt-4o-mini",
                Self::Tiles {
                    base: 2833,
                    per_tile: 5667,
                },
            ),
            ("gpt-4.1-mini", Self::Patches { per_thousand: 1620 }),
            ("gpt-4.1-nano", Self::Patches { per_thousand: 2460 }),
            ("gpt-5-mini", Self::Patches { per_thousand: 1620 }),
            ("gpt-5-nano", Self::Patches { per_thousand: 2460 }),
            ("o4-mini", Self::Patches { per_thousand: 1720 }),
            (
                "o1",
                Self::Tiles {
                    base: 75,
                    per_tile: 150,
                },
            ),
            (
                "o3",
                Self::Tiles {
                    base: 75,
                    per_tile: 150,
                },
            ),
            (
                "gpt-5",
                Self::Tiles {
                    base: 70,
                    per_tile: 140,
                },
            ),
            (
                "gpt-4",
                Self::Tiles {
                    base: 85,
                    per_tile: 170,
                },
            ),
            (
                "chatgpt-4o",
                Self::Tiles {
                    base: 85,
                    per_tile: 170,
                },
            ),
            (
                "computer-use",
                Self::Tiles {
                    base: 65,
                    per_tile: 129,
                },
            ),
        ];
        rules
            .into_iter()
            .find(|(prefix, _)| name.starts_with(prefix))
            .map_or(Self::DEAREST, |(_, rule)| rule)
    }

    /// The rule that counts every image at the most any counts.
    const DEAREST: Self = Self::Tiles {
        base: 2833,
        per_tile: 5667,
    };

    fn tokens(self, width: f64, height: f64) -> u64 {
        match self {
            Self::Tiles { base, per_tile } => {
                let fit = (2048.0 / width.max(height)).min(1.0);
                let (width, height) = (width * fit, height * fit);
                let shorten = (768.0 / width.min(height)).min(1.0);
                // Rounded, not raised: a side fitted to 2048 or 768 stays that, whatever the
                // floating point made of it. A side never rounds below a pixel: a very thin
                // image (20000 × 3) is still a row of tiles, not none.
                let side = |side: f64| (side * shorten).round().max(1.0);
                let (width, height) = (side(width), side(height));
                let tiles = (width / 512.0).ceil() * (height / 512.0).ceil();
                base + per_tile * tiles as u64
            }
            Self::Patches { per_thousand } => {
                // A scaled-down image has at most MAX_PATCHES; counting the original's
                // patches up to it bounds what the provider counts.
                let patches = ((width / 32.0).ceil() * (height / 32.0).ceil()) as u64;
                (patches.min(MAX_PATCHES) * per_thousand).div_ceil(1000)
            }
        }
    }
}

impl Shape {
    /// What an image of `width` × `height` counts as sent to `model` (OpenAI's high
    /// detail by the model's rule, [`OpenAiImages`]; Anthropic's: long side brought
    /// down to 1568, then width × height / 750, rounded up). `None`: an image by URL,
    /// counted at the most any image counts.
    pub fn image_tokens(self, model: &str, size: Option<(u32, u32)>) -> u64 {
        let (width, height) = match (self, size) {
            (_, Some(size)) => size,
            (Self::OpenAi, None) => (768, 2048),
            (Self::Anthropic, None) => (1568, 1568),
        };
        let (width, height) = (f64::from(width), f64::from(height));
        match self {
            Self::OpenAi => {
                let rule = OpenAiImages::of_model(model);
                match size {
                    Some(_) => rule.tokens(width, height),
                    // By URL: the larger of the largest tiled and the largest patched image.
                    None => rule
                        .tokens(width, height)
                        .max(rule.tokens(1536.0 * 32.0, 32.0)),
                }
            }
            Self::Anthropic => {
                let fit = (1568.0 / width.max(height)).min(1.0);
                // At least a pixel a side and a token an image, as for OpenAI: a very
                // thin image must not count as nothing.
                let side = |side: f64| (side * fit).round().max(1.0);
                let (width, height) = (side(width), side(height));
                ((width * height / 750.0).ceil() as u64).max(1)
            }
        }
    }

    /// What the media parts among `parts` count as sent to `model` (text parts count
    /// as text).
    pub fn media_tokens<'a>(self, model: &str, parts: impl IntoIterator<Item = &'a Part>) -> u64 {
        parts
            .into_iter()
            .map(|part| match part {
                Part::Text { .. } => 0,
                Part::Image { size, .. } => self.image_tokens(model, *size),
                Part::Document {
                    pages, text_tokens, ..
                } => document_tokens(*pages, *text_tokens),
            })
            .sum()
    }
}

/// What a document counts as in a hold: each page's allowance and its text's bound.
pub fn document_tokens(pages: u32, text_tokens: u64) -> u64 {
    (TOKENS_PER_PDF_PAGE * u64::from(pages)).saturating_add(text_tokens)
}

impl Part {
    /// The part's text, for a text part.
    pub fn text(&self) -> Option<&str> {
        match self {
            Self::Text { text } => Some(text),
            Self::Image { .. } | Self::Document { .. } => None,
        }
    }

    /// The part in OpenAI's chat completions shape.
    pub fn to_openai(&self) -> Value {
        match self {
            Self::Text { text } => json!({"type": "text", "text": text}),
            Self::Image { source, .. } => {
                let url = match source {
                    Source::Base64 { media_type, data } => {
                        format!("data:{media_type};base64,{data}")
                    }
                    Source::Url { url } => url.clone(),
                };
                json!({"type": "image_url", "image_url": {"url": url, "detail": "high"}})
            }
            Self::Document { source, .. } => {
                let data = match source {
                    Source::Base64 { media_type, data } => {
                        format!("data:{media_type};base64,{data}")
                    }
                    // Refused when the job was created: nothing bounds its pages.
                    Source::Url { url } => url.clone(),
                };
                json!({"type": "file", "file": {"filename": "document.pdf", "file_data": data}})
            }
        }
    }

    /// The part as an Anthropic content block.
    pub fn to_anthropic(&self) -> Value {
        let source = |source: &Source| match source {
            Source::Base64 { media_type, data } => {
                json!({"type": "base64", "media_type": media_type, "data": data})
            }
            Source::Url { url } => json!({"type": "url", "url": url}),
        };
        match self {
            Self::Text { text } => json!({"type": "text", "text": text}),
            Self::Image { source: from, .. } => json!({"type": "image", "source": source(from)}),
            Self::Document { source: from, .. } => {
                json!({"type": "document", "source": source(from)})
            }
        }
    }
}

/// A message's content in OpenAI's shape: its text alone when it has no parts, else
/// a list of parts, the text first.
pub fn openai_content(message: &super::Message) -> Value {
    if message.parts.is_empty() {
        return json!(message.content);
    }
    let text =
        (!message.content.is_empty()).then(|| json!({"type": "text", "text": message.content}));
    Value::Array(
        text.into_iter()
            .chain(message.parts.iter().map(Part::to_openai))
            .collect(),
    )
}

/// A message's content in Anthropic's shape: its text alone when it has no parts,
/// else a list of content blocks, the text first.
pub fn anthropic_content(message: &super::Message) -> Value {
    if message.parts.is_empty() {
        return json!(message.content);
    }
    let text =
        (!message.content.is_empty()).then(|| json!({"type": "text", "text": message.content}));
    Value::Array(
        text.into_iter()
            .chain(message.parts.iter().map(Part::to_anthropic))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_openai_model_counts_images_by_its_own_rule() {
        let one = Some((1, 1));
        let square = Some((1024, 1024));
        let cases = [
            // Tiles: 1 × 1 is one tile; 1024 × 1024 becomes 768 × 768, four tiles.
            ("gpt-4o", one, 85 + 170),
            ("gpt-4o-2024-08-06", square, 85 + 170 * 4),
            ("gpt-4o-mini", one, 2833 + 5667),
            ("gpt-4o-mini", square, 2833 + 5667 * 4),
            ("o1", square, 75 + 150 * 4),
            ("o3", square, 75 + 150 * 4),
            ("gpt-5", square, 70 + 140 * 4),
            // Patches: 1024 × 1024 is 32 × 32 = 1,024 patches, times the multiplier.
            ("gpt-4.1-mini", square, 1659),
            ("gpt-4.1-nano", square, 2520),
            ("o4-mini", square, 1762),
            // 4096 × 4096 has 16,384 patches; scaled down, at most 1,536.
            ("gpt-4.1-mini", Some((4096, 4096)), 2489),
            // Unknown here: the dearest rule.
            ("my-local-model", one, 2833 + 5667),
            ("ft:gpt-4o-mini:org::id", one, 2833 + 5667),
        ];
        for (model, size, tokens) in cases {
            assert_eq!(
                Shape::OpenAi.image_tokens(model, size),
                tokens,
                "{model} {size:?}"
            );
        }
        // By URL, at the most any image of the model's rule counts.
        assert_eq!(Shape::OpenAi.image_tokens("gpt-4o", None), 85 + 170 * 8);
        assert_eq!(Shape::OpenAi.image_tokens("gpt-4.1-mini", None), 2489);
    }

    #[test]
    fn openai_counts_tiles_after_its_resizing() {
        // 1024 × 1024 becomes 768 × 768: four tiles.
        assert_eq!(
            Shape::OpenAi.image_tokens("gpt-4o", Some((1024, 1024))),
            85 + 170 * 4
        );
        // 2048 × 4096 fits as 1024 × 2048, then 768 × 1536: six tiles.
        assert_eq!(
            Shape::OpenAi.image_tokens("gpt-4o", Some((2048, 4096))),
            85 + 170 * 6
        );
        // Small images are not enlarged: one tile.
        assert_eq!(
            Shape::OpenAi.image_tokens("gpt-4o", Some((100, 80))),
            85 + 170
        );
        assert_eq!(
            Shape::OpenAi.image_tokens("gpt-4o", None),
            85 + 170 * 8,
            "the most any image counts"
        );
        for size in [
            (1, 1),
            (512, 512),
            (768, 2048),
            (3000, 1000),
            (5000, 100),
            (10_000, 10_000),
        ] {
            assert!(
                Shape::OpenAi.image_tokens("gpt-4o", Some(size))
                    <= Shape::OpenAi.image_tokens("gpt-4o", None)
            );
        }
    }

    #[test]
    fn anthropic_counts_pixels_after_its_resizing() {
        assert_eq!(
            Shape::Anthropic.image_tokens("claude-sonnet-4-5", Some((1000, 750))),
            1000
        );
        // 3136 × 1568 comes down to 1568 × 784.
        assert_eq!(
            Shape::Anthropic.image_tokens("claude-sonnet-4-5", Some((3136, 1568))),
            1568 * 784 / 750 + 1
        );
        for size in [(1, 1), (1568, 1568), (5000, 100), (10_000, 10_000)] {
            assert!(
                Shape::Anthropic.image_tokens("claude-sonnet-4-5", Some(size))
                    <= Shape::Anthropic.image_tokens("claude-sonnet-4-5", None)
            );
        }
    }

    /// A very thin image comes out of the providers' resizing with a side below half a
    /// pixel: it still counts as the provider bills it, a row of tiles (OpenAI) and
    /// pixels of one row (Anthropic), never nothing.
    #[test]
    fn very_thin_images_count_at_least_what_the_provider_bills() {
        // 20000 × 3 fits in 2048 × 2048 as 2048 × 0.3: four tiles in a row.
        for size in [(20_000, 3), (3, 20_000)] {
            assert_eq!(
                Shape::OpenAi.image_tokens("gpt-4o", Some(size)),
                85 + 170 * 4,
                "{size:?}"
            );
            // 1568 × 1 after Anthropic's resizing: 1568 / 750, rounded up.
            assert_eq!(
                Shape::Anthropic.image_tokens("claude-sonnet-4-5", Some(size)),
                3,
                "{size:?}"
            );
        }
        assert!(Shape::OpenAi.image_tokens("gpt-4o-mini", Some((100_000, 1))) >= 2833 + 5667);
        assert!(Shape::Anthropic.image_tokens("claude-sonnet-4-5", Some((100_000, 1))) >= 1);
    }

    #[test]
    fn models_take_what_their_provider_reads() {
        assert!(MediaInput::of_model("gpt-4o-mini").documents);
        assert!(MediaInput::of_model("claude-sonnet-4-5").documents);
        assert_eq!(
            MediaInput::of_model("claude-3-haiku-20240307"),
            MediaInput {
                images: true,
                documents: false
            }
        );
        assert!(!MediaInput::of_model("o3-mini").images);
        assert!(!MediaInput::of_model("gpt-3.5-turbo").images);
        assert!(!MediaInput::of_model("llama3").images);
    }
}
