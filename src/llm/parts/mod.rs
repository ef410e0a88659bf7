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

/// What a PDF page counts as, for both providers.
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

impl Shape {
    /// What an image of `width` × `height` counts as (OpenAI's high detail: fitted
    /// in 2048 × 2048, its shortest side brought down to 768, then 85 tokens and 170
    /// per 512-pixel tile; Anthropic's: long side brought down to 1568, then width ×
    /// height / 750, rounded up). `None`: an image by URL, counted at the most any
    /// image counts.
    pub fn image_tokens(self, size: Option<(u32, u32)>) -> u64 {
        let (width, height) = match (self, size) {
            (_, Some(size)) => size,
            (Self::OpenAi, None) => (768, 2048),
            (Self::Anthropic, None) => (1568, 1568),
        };
        let (width, height) = (f64::from(width), f64::from(height));
        match self {
            Self::OpenAi => {
                let fit = (2048.0 / width.max(height)).min(1.0);
                let (width, height) = (width * fit, height * fit);
                let shorten = (768.0 / width.min(height)).min(1.0);
                // Rounded, not raised: a side fitted to 2048 or 768 stays that, whatever the
                // floating point made of it.
                let (width, height) = ((width * shorten).round(), (height * shorten).round());
                let tiles = (width / 512.0).ceil() * (height / 512.0).ceil();
                85 + 170 * tiles as u64
            }
            Self::Anthropic => {
                let fit = (1568.0 / width.max(height)).min(1.0);
                let (width, height) = ((width * fit).round(), (height * fit).round());
                (width * height / 750.0).ceil() as u64
            }
        }
    }

    /// What the media parts among `parts` count as (text parts count as text).
    pub fn media_tokens<'a>(self, parts: impl IntoIterator<Item = &'a Part>) -> u64 {
        parts
            .into_iter()
            .map(|part| match part {
                Part::Text { .. } => 0,
                Part::Image { size, .. } => self.image_tokens(*size),
                Part::Document { pages, .. } => TOKENS_PER_PDF_PAGE * u64::from(*pages),
            })
            .sum()
    }
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
    fn openai_counts_tiles_after_its_resizing() {
        // 1024 × 1024 becomes 768 × 768: four tiles.
        assert_eq!(Shape::OpenAi.image_tokens(Some((1024, 1024))), 85 + 170 * 4);
        // 2048 × 4096 fits as 1024 × 2048, then 768 × 1536: six tiles.
        assert_eq!(Shape::OpenAi.image_tokens(Some((2048, 4096))), 85 + 170 * 6);
        // Small images are not enlarged: one tile.
        assert_eq!(Shape::OpenAi.image_tokens(Some((100, 80))), 85 + 170);
        assert_eq!(
            Shape::OpenAi.image_tokens(None),
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
            assert!(Shape::OpenAi.image_tokens(Some(size)) <= Shape::OpenAi.image_tokens(None));
        }
    }

    #[test]
    fn anthropic_counts_pixels_after_its_resizing() {
        assert_eq!(Shape::Anthropic.image_tokens(Some((1000, 750))), 1000);
        // 3136 × 1568 comes down to 1568 × 784.
        assert_eq!(
            Shape::Anthropic.image_tokens(Some((3136, 1568))),
            1568 * 784 / 750 + 1
        );
        for size in [(1, 1), (1568, 1568), (5000, 100), (10_000, 10_000)] {
            assert!(
                Shape::Anthropic.image_tokens(Some(size)) <= Shape::Anthropic.image_tokens(None)
            );
        }
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
