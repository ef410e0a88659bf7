//! Relay pages: a service's [`Page`] of rows as a connection's edges and page info.

use crate::page::Page;
use async_graphql::SimpleObject;

/// Relay page information.
#[derive(SimpleObject)]
pub struct PageInfo {
    pub has_next_page: bool,
    pub end_cursor: Option<String>,
}

/// A page's rows as edges, and its page information: the end cursor is the last
/// edge's, so a client pages on from exactly where this page stopped.
pub fn connect<T, E>(
    page: Page<T>,
    edge: impl FnMut(T) -> E,
    cursor: impl Fn(&E) -> &str,
) -> (Vec<E>, PageInfo) {
    let edges: Vec<E> = page.items.into_iter().map(edge).collect();
    let page_info = PageInfo {
        has_next_page: page.has_next_page,
        end_cursor: edges.last().map(|last| cursor(last).to_owned()),
    };
    (edges, page_info)
}
