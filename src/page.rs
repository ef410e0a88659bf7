//! Which page of a newest-first list a client asked for: the one parsing of `first`
//! and `after` that every paginated field (jobs, batches, webhook deliveries, the
//! ledger, job costs, tenants) and the query cost pre-pass share.

use crate::error::ServiceError;
use uuid::Uuid;

/// Rows per page when the client does not say.
pub const DEFAULT_PAGE_SIZE: u64 = 20;
/// The most rows one page may hold.
pub const MAX_PAGE_SIZE: u64 = 100;

/// Which page: `first` rows older than the row `after`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageRequest {
    pub first: u64,
    pub after: Option<Uuid>,
}

impl PageRequest {
    /// A page request from the client's `first` ([`DEFAULT_PAGE_SIZE`] when not
    /// given, 1 to [`MAX_PAGE_SIZE`]) and `after` (the cursor of the previous page's
    /// last row).
    pub fn new(first: Option<i32>, after: Option<&str>) -> Result<Self, ServiceError> {
        let first = match first {
            None => DEFAULT_PAGE_SIZE,
            Some(first) => u64::try_from(first)
                .ok()
                .filter(|first| (1..=MAX_PAGE_SIZE).contains(first))
                .ok_or_else(|| {
                    ServiceError::validation(format!("first must be 1 to {MAX_PAGE_SIZE}"))
                })?,
        };
        let after = after
            .map(|cursor| Uuid::parse_str(cursor).map_err(|_| unknown_cursor()))
            .transpose()?;
        Ok(Self { first, after })
    }
}

/// One page of a list: its rows and whether more follow.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Page<T> {
    pub items: Vec<T>,
    pub has_next_page: bool,
}

impl<T> Page<T> {
    /// The page from rows fetched with a limit of `first + 1`: the extra row only says
    /// that there is more.
    pub fn from_rows(mut items: Vec<T>, first: u64) -> Self {
        let has_next_page = items.len() as u64 > first;
        items.truncate(usize::try_from(first).unwrap_or(usize::MAX));
        Self {
            items,
            has_next_page,
        }
    }

    /// A page of nothing, with nothing after it.
    pub fn empty() -> Self {
        Self {
            items: Vec::new(),
            has_next_page: false,
        }
    }
}

/// The refusal of an `after` that is no cursor of the list it is given to.
pub fn unknown_cursor() -> ServiceError {
    ServiceError::validation("after is not a cursor from this list")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(first: Option<i32>, after: Option<&str>) -> String {
        PageRequest::new(first, after)
            .expect_err("refused")
            .to_string()
    }

    #[test]
    fn first_defaults_to_twenty_and_takes_one_to_a_hundred() {
        assert_eq!(
            PageRequest::new(None, None).unwrap().first,
            DEFAULT_PAGE_SIZE
        );
        assert_eq!(PageRequest::new(Some(1), None).unwrap().first, 1);
        assert_eq!(PageRequest::new(Some(100), None).unwrap().first, 100);
        for first in [0, -1, 101, i32::MAX] {
            assert_eq!(refusal(Some(first), None), "first must be 1 to 100");
        }
    }

    #[test]
    fn a_page_keeps_first_rows_and_says_whether_the_extra_one_came() {
        assert_eq!(
            Page::from_rows(vec![1, 2, 3], 2),
            Page {
                items: vec![1, 2],
                has_next_page: true
            }
        );
        assert_eq!(
            Page::from_rows(vec![1, 2], 2),
            Page {
                items: vec![1, 2],
                has_next_page: false
            }
        );
        assert_eq!(Page::<u8>::from_rows(Vec::new(), 2), Page::empty());
    }

    #[test]
    fn after_is_a_cursor_or_refused() {
        let id = Uuid::from_u128(7);
        let page = PageRequest::new(Some(5), Some(&id.to_string())).unwrap();
        assert_eq!(
            page,
            PageRequest {
                first: 5,
                after: Some(id)
            }
        );
        assert_eq!(
            refusal(None, Some("not a cursor")),
            "after is not a cursor from this list"
        );
    }
}
