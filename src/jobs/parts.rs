//! The parts of a job's messages beyond their text, checked when the job is created:
//! every image and document is decoded, measured and bounded there, so that what is
//! stored can always be sent and counted. Errors name the part, never its data.

use crate::error::ServiceError;
use crate::llm::Role;
use crate::llm::parts::pdf::{self, InflateBudget};
use crate::llm::parts::{ImageFormat, MediaInput, PDF_MEDIA_TYPE, Part, Source, image};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;

/// Most parts (of any type) one job's messages carry in all.
pub const MAX_PARTS: usize = 20;
/// Largest image or document, decoded: Anthropic's limit for an image.
pub const MAX_PART_BYTES: usize = 5 * 1024 * 1024;
/// Most image and document bytes, decoded, of one job: what fits a request's body
/// once in base64.
pub const MAX_MEDIA_BYTES: usize = 10 * 1024 * 1024;
/// Longest URL of a part.
const MAX_URL_LENGTH: usize = 2_048;

/// A part's type, as the API names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PartType {
    Text,
    Image,
    Document,
}

/// One part as the API receives it, before any check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartRequest {
    pub kind: PartType,
    pub text: Option<String>,
    /// Base64.
    pub data: Option<String>,
    pub url: Option<String>,
    pub media_type: Option<String>,
}

impl PartRequest {
    /// A document given as data: measured, which may take seconds (see
    /// `jobs::measuring`).
    pub fn is_document_data(&self) -> bool {
        self.kind == PartType::Document && self.data.is_some()
    }
}

/// What the parts of one job add up to, checked across its messages.
#[derive(Default)]
pub struct PartBudget {
    parts: usize,
    media_bytes: usize,
}

impl PartBudget {
    /// The parts of message `index`, of `role`, checked and measured, their
    /// documents' streams inflating within `inflate` (the request's, shared by all
    /// its jobs' documents).
    pub fn parse(
        &mut self,
        index: usize,
        role: Role,
        requests: Vec<PartRequest>,
        inflate: &mut InflateBudget,
    ) -> Result<Vec<Part>, ServiceError> {
        requests
            .into_iter()
            .enumerate()
            .map(|(number, request)| {
                let at = |message: String| {
                    ServiceError::validation(format!("messages[{index}].parts[{number}]: {message}"))
                };
                self.parts += 1;
                if self.parts > MAX_PARTS {
                    return Err(ServiceError::validation(format!(
                        "messages carry more than {MAX_PARTS} parts; at most {MAX_PARTS} are accepted"
                    )));
                }
                self.parse_one(role, request, inflate).map_err(at)
            })
            .collect()
    }

    fn parse_one(
        &mut self,
        role: Role,
        request: PartRequest,
        inflate: &mut InflateBudget,
    ) -> Result<Part, String> {
        let PartRequest {
            kind,
            text,
            data,
            url,
            media_type,
        } = request;
        if kind == PartType::Text {
            if data.is_some() || url.is_some() || media_type.is_some() {
                return Err("a TEXT part takes text only".into());
            }
            return match text {
                Some(text) if !text.is_empty() => Ok(Part::Text { text }),
                _ => Err("a TEXT part needs its text".into()),
            };
        }
        if text.is_some() {
            return Err("an IMAGE or DOCUMENT part takes data or url, not text".into());
        }
        // OpenAI takes images only from the user, Anthropic documents likewise.
        if role != Role::User {
            return Err("images and documents are taken in user messages only".into());
        }
        let source = match (data, url) {
            (Some(data), None) => Fetched::Data(self.decode(&data)?, data),
            (None, Some(url)) => Fetched::Url(check_url(url)?),
            _ => return Err("an IMAGE or DOCUMENT part needs either data or url".into()),
        };
        match kind {
            PartType::Image => image_part(source, media_type),
            PartType::Document => document_part(source, media_type, inflate),
            PartType::Text => unreachable!("handled above"),
        }
    }

    fn decode(&mut self, data: &str) -> Result<Vec<u8>, String> {
        // Refused before decoding: base64 is four bytes for every three.
        if data.len() / 4 * 3 > MAX_PART_BYTES + 3 {
            return Err(format!(
                "data holds more than {MAX_PART_BYTES} bytes; at most {MAX_PART_BYTES} are accepted"
            ));
        }
        let bytes = STANDARD
            .decode(data.trim())
            .map_err(|_| "data is not valid base64".to_owned())?;
        if bytes.len() > MAX_PART_BYTES {
            return Err(format!(
                "data holds {} bytes; at most {MAX_PART_BYTES} are accepted",
                bytes.len()
            ));
        }
        self.media_bytes += bytes.len();
        if self.media_bytes > MAX_MEDIA_BYTES {
            return Err(format!(
                "the job's images and documents hold more than {MAX_MEDIA_BYTES} bytes; at most {MAX_MEDIA_BYTES} are accepted"
            ));
        }
        Ok(bytes)
    }
}

/// A part's bytes, decoded, with the base64 they came as; or its URL.
enum Fetched {
    Data(Vec<u8>, String),
    Url(String),
}

/// A URL a provider can fetch: `https` (or `http`), one line, not too long. Its
/// bytes are never fetched here.
fn check_url(url: String) -> Result<String, String> {
    let url = url.trim().to_owned();
    if url.len() > MAX_URL_LENGTH {
        return Err(format!("url is longer than {MAX_URL_LENGTH} bytes"));
    }
    if !(url.starts_with("https://") || url.starts_with("http://"))
        || url.chars().any(|c| c.is_whitespace() || c.is_control())
    {
        return Err("url must be an http or https URL".into());
    }
    Ok(url)
}

fn image_part(source: Fetched, media_type: Option<String>) -> Result<Part, String> {
    let named = match media_type.as_deref() {
        Some(name) => Some(ImageFormat::of_media_type(name).ok_or_else(|| {
            "mediaType of an IMAGE must be image/png, image/jpeg, image/gif or image/webp"
                .to_owned()
        })?),
        None => None,
    };
    match source {
        Fetched::Data(bytes, data) => {
            let (format, width, height) = image::read_header(&bytes)
                .ok_or_else(|| "data is not a PNG, JPEG, GIF or WebP image".to_owned())?;
            if named.is_some_and(|named| named != format) {
                return Err(format!(
                    "mediaType does not match the data, which is {}",
                    format.media_type()
                ));
            }
            Ok(Part::Image {
                source: Source::Base64 {
                    media_type: format.media_type().to_owned(),
                    data,
                },
                size: Some((width, height)),
            })
        }
        Fetched::Url(url) => Ok(Part::Image {
            source: Source::Url { url },
            size: None,
        }),
    }
}

fn document_part(
    source: Fetched,
    media_type: Option<String>,
    inflate: &mut InflateBudget,
) -> Result<Part, String> {
    if media_type
        .as_deref()
        .is_some_and(|name| !name.eq_ignore_ascii_case(PDF_MEDIA_TYPE))
    {
        return Err(format!("mediaType of a DOCUMENT must be {PDF_MEDIA_TYPE}"));
    }
    match source {
        Fetched::Data(bytes, data) => {
            let measure = pdf::measure(&bytes, inflate).map_err(|error| error.to_string())?;
            Ok(Part::Document {
                source: Source::Base64 {
                    media_type: PDF_MEDIA_TYPE.to_owned(),
                    data,
                },
                pages: measure.pages,
                text_tokens: measure.text_tokens,
            })
        }
        // Its pages, and so its tokens, cannot be known before the provider reads it.
        Fetched::Url(_) => Err(
            "a DOCUMENT is taken as data only: by URL its pages cannot be counted before the hold"
                .into(),
        ),
    }
}

/// `Validation` when `model` cannot take the images or documents among `parts`.
pub fn check_model_takes<'a>(
    model: &str,
    parts: impl IntoIterator<Item = &'a Part>,
) -> Result<(), ServiceError> {
    let takes = MediaInput::of_model(model);
    for part in parts {
        let refused = match part {
            Part::Text { .. } => None,
            Part::Image { .. } => (!takes.images).then_some("images"),
            Part::Document { .. } => (!takes.documents).then_some("documents"),
        };
        if let Some(what) = refused {
            return Err(ServiceError::validation(format!(
                "model {model:?} takes no {what}"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::parts::image::samples::png;
    use crate::llm::parts::pdf::samples::pdf;

    fn part(kind: PartType, data: Option<&[u8]>, media_type: Option<&str>) -> PartRequest {
        PartRequest {
            kind,
            text: None,
            data: data.map(|bytes| STANDARD.encode(bytes)),
            url: None,
            media_type: media_type.map(str::to_owned),
        }
    }

    fn parse(request: PartRequest) -> Result<Part, String> {
        match PartBudget::default().parse(
            0,
            Role::User,
            vec![request],
            &mut InflateBudget::default(),
        ) {
            Ok(mut parts) => Ok(parts.remove(0)),
            Err(ServiceError::Validation(message)) => Err(message),
            Err(other) => panic!("{other:?}"),
        }
    }

    #[test]
    fn images_and_documents_are_measured() {
        let image = parse(part(
            PartType::Image,
            Some(&png(800, 600)),
            Some("image/png"),
        ))
        .unwrap();
        assert!(matches!(
            image,
            Part::Image {
                size: Some((800, 600)),
                ..
            }
        ));
        let document = parse(part(PartType::Document, Some(&pdf(4)), None)).unwrap();
        assert!(matches!(document, Part::Document { pages: 4, .. }));
    }

    #[test]
    fn bad_parts_are_refused_without_their_data() {
        let secret = b"%PDF-1.4 secret-contents";
        let mut not_base64 = part(PartType::Image, None, None);
        not_base64.data = Some("not base64 at all!".into());
        let mut url_document = part(PartType::Document, None, None);
        url_document.url = Some("https://example.com/a.pdf".into());
        let cases = [
            (not_base64, "base64"),
            (part(PartType::Image, Some(secret), None), "not a PNG"),
            (
                part(PartType::Document, Some(&png(10, 10)), None),
                "not a PDF",
            ),
            (
                part(PartType::Image, Some(&png(10, 10)), Some("image/tiff")),
                "mediaType",
            ),
            (
                part(PartType::Image, Some(&png(10, 10)), Some("image/jpeg")),
                "does not match",
            ),
            (
                part(PartType::Document, Some(&pdf(1)), Some("text/plain")),
                "mediaType",
            ),
            (
                part(PartType::Image, Some(&vec![0; MAX_PART_BYTES + 1]), None),
                "at most",
            ),
            (url_document, "URL"),
            (part(PartType::Image, None, None), "either data or url"),
        ];
        for (request, reason) in cases {
            let message = parse(request).unwrap_err();
            assert!(
                message.contains(reason),
                "{message:?} should say {reason:?}"
            );
            assert!(message.starts_with("messages[0].parts[0]"), "{message:?}");
            assert!(!message.contains("secret"), "{message:?} shows the data");
        }
    }

    #[test]
    fn media_come_from_the_user_and_within_the_count() {
        let image = || part(PartType::Image, Some(&png(10, 10)), None);
        assert!(
            PartBudget::default()
                .parse(
                    0,
                    Role::System,
                    vec![image()],
                    &mut InflateBudget::default()
                )
                .is_err()
        );
        let many = vec![image(); MAX_PARTS + 1];
        assert!(
            PartBudget::default()
                .parse(0, Role::User, many, &mut InflateBudget::default())
                .is_err()
        );
    }

    #[test]
    fn a_model_without_document_input_refuses_a_pdf() {
        let document = parse(part(PartType::Document, Some(&pdf(1)), None)).unwrap();
        assert!(check_model_takes("gpt-4o", [&document]).is_ok());
        assert!(check_model_takes("claude-3-haiku-20240307", [&document]).is_err());
        assert!(check_model_takes("o3-mini", [&document]).is_err());
    }
}
