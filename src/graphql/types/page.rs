//! Relay pages: a service's [`Page`] of rows as a connection's edges and page info.

use crate::page::Page;
use async_graphql::SimpleObject;
use uuid::Uuid;

/// Relay page information.
#[derive(SimpleObject)]
pub struct PageInfo {
    pub has_next_page: bool,
    pub end_cursor: Option<String>,
}

/// A connection's edge: a node and the cursor to page on from it.
pub trait Edge {
    type Node;
    fn new(cursor: String, node: Self::Node) -> Self;
    fn cursor(&self) -> &str;
}

/// Declares an edge type (`cursor` and `node`) with its [`Edge`] impl.
macro_rules! edge {
    ($(#[$doc:meta])* $name:ident of $node:ty) => {
        $(#[$doc])*
        #[derive(async_graphql::SimpleObject)]
        pub struct $name {
            pub cursor: String,
            pub node: $node,
        }

        impl $crate::graphql::types::Edge for $name {
            type Node = $node;
            fn new(cursor: String, node: $node) -> Self {
                Self { cursor, node }
            }
            fn cursor(&self) -> &str {
                &self.cursor
            }
        }
    };
}
pub(crate) use edge;

/// A page's rows as edges, each row's id its cursor (every list pages by id), and
/// the page information: the end cursor is the last edge's, so a client pages on
/// from exactly where this page stopped.
pub fn connect<T, E: Edge>(
    page: Page<T>,
    mut node: impl FnMut(T) -> (Uuid, E::Node),
) -> (Vec<E>, PageInfo) {
    let edges: Vec<E> = page
        .items
        .into_iter()
        .map(|row| {
            let (id, node) = node(row);
            E::new(id.to_string(), node)
        })
        .collect();
    let page_info = PageInfo {
        has_next_page: page.has_next_page,
        end_cursor: edges.last().map(|last| last.cursor().to_owned()),
    };
    (edges, page_info)
}
