//! The cost of a parsed document with its fragments expanded, counted without
//! expanding them.

use super::{CostError, QueryBudget};
use async_graphql::Name;
use async_graphql::parser::types::{
    DocumentOperations, ExecutableDocument, Selection, SelectionSet,
};
use std::collections::HashMap;

/// What a parsed document holds once every fragment spread is replaced by its
/// fragment, as validation and execution see it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DocumentCost {
    pub selections: u64,
    pub aliases: u64,
    pub directives: u64,
    /// `__schema` and `__type` fields: each answers with much of the schema.
    pub introspections: u64,
}

impl DocumentCost {
    fn add(self, other: Self) -> Self {
        Self {
            selections: self.selections.saturating_add(other.selections),
            aliases: self.aliases.saturating_add(other.aliases),
            directives: self.directives.saturating_add(other.directives),
            introspections: self.introspections.saturating_add(other.introspections),
        }
    }
}

/// Measures `document` and refuses it when it passes `budget`.
pub fn check_document(
    document: &ExecutableDocument,
    budget: &QueryBudget,
) -> Result<DocumentCost, CostError> {
    let cost = measure(document)?;
    if cost.selections > budget.selections {
        return Err(CostError::TooManySelections {
            count: cost.selections,
            limit: budget.selections,
        });
    }
    if cost.aliases > budget.aliases {
        return Err(CostError::TooManyAliases {
            count: cost.aliases,
            limit: budget.aliases,
        });
    }
    if cost.directives > budget.directives {
        return Err(CostError::TooManyDirectives {
            count: cost.directives,
            limit: budget.directives,
        });
    }
    if cost.introspections > budget.introspections {
        return Err(CostError::TooManyIntrospections {
            count: cost.introspections,
            limit: budget.introspections,
        });
    }
    Ok(cost)
}

/// The cost of every operation with its fragments expanded, plus each fragment
/// definition once (validation walks those too). Each fragment's cost is computed
/// once and added at each spread, so a fragment spread twice counts twice without
/// being expanded twice; the sums saturate. A fragment that spreads itself, directly
/// or not, is refused. Spreads of unknown fragments count nothing here: validation
/// refuses them.
pub fn measure(document: &ExecutableDocument) -> Result<DocumentCost, CostError> {
    let mut fragments = FragmentCosts::new(document);
    for name in document.fragments.keys() {
        fragments.resolve(name)?;
    }
    let mut total = document
        .fragments
        .keys()
        .filter_map(|name| fragments.cost_of(name))
        .fold(DocumentCost::default(), DocumentCost::add);
    let operations: Vec<_> = match &document.operations {
        DocumentOperations::Single(operation) => vec![operation],
        DocumentOperations::Multiple(operations) => operations.values().collect(),
    };
    for operation in operations {
        let directives = DocumentCost {
            directives: operation.node.directives.len() as u64,
            ..DocumentCost::default()
        };
        total = total
            .add(directives)
            .add(fragments.selection_set_cost(&operation.node.selection_set.node));
    }
    Ok(total)
}

/// The memoised cost of each fragment of one document.
struct FragmentCosts<'a> {
    document: &'a ExecutableDocument,
    state: HashMap<&'a Name, FragmentState>,
}

#[derive(Clone, Copy)]
enum FragmentState {
    /// Its spreads are being resolved: meeting it again is a cycle.
    InProgress,
    Done(DocumentCost),
}

impl<'a> FragmentCosts<'a> {
    fn new(document: &'a ExecutableDocument) -> Self {
        Self {
            document,
            state: HashMap::new(),
        }
    }

    fn cost_of(&self, name: &Name) -> Option<DocumentCost> {
        match self.state.get(name) {
            Some(FragmentState::Done(cost)) => Some(*cost),
            _ => None,
        }
    }

    /// Computes the cost of fragment `name` and of every fragment it spreads, depth
    /// first with an explicit stack (a chain of thousands of fragments must not
    /// exhaust the thread's stack).
    fn resolve(&mut self, name: &'a Name) -> Result<(), CostError> {
        // (fragment, whether its spreads have been pushed already)
        let mut stack = vec![(name, false)];
        while let Some((name, spreads_pushed)) = stack.pop() {
            let Some(fragment) = self.document.fragments.get(name) else {
                continue;
            };
            let selection_set = &fragment.node.selection_set.node;
            if spreads_pushed {
                let own = DocumentCost {
                    directives: fragment.node.directives.len() as u64,
                    ..DocumentCost::default()
                };
                let cost = own.add(self.selection_set_cost(selection_set));
                self.state.insert(name, FragmentState::Done(cost));
                continue;
            }
            match self.state.get(name) {
                Some(FragmentState::Done(_)) => continue,
                Some(FragmentState::InProgress) => {
                    return Err(CostError::FragmentCycle(name.to_string()));
                }
                None => {}
            }
            self.state.insert(name, FragmentState::InProgress);
            stack.push((name, true));
            let mut spreads = Vec::new();
            spreads_in(selection_set, &mut spreads);
            for spread in spreads {
                match self.state.get(spread) {
                    Some(FragmentState::InProgress) => {
                        return Err(CostError::FragmentCycle(spread.to_string()));
                    }
                    Some(FragmentState::Done(_)) => {}
                    None => stack.push((spread, false)),
                }
            }
        }
        Ok(())
    }

    /// The cost of a selection set whose spreads are all resolved. Recursion follows
    /// the document's nesting, which `check_text` bounds.
    fn selection_set_cost(&self, selection_set: &SelectionSet) -> DocumentCost {
        selection_set
            .items
            .iter()
            .map(|selection| match &selection.node {
                Selection::Field(field) => DocumentCost {
                    selections: 1,
                    aliases: u64::from(field.node.alias.is_some()),
                    directives: field.node.directives.len() as u64,
                    introspections: u64::from(matches!(
                        field.node.name.node.as_str(),
                        "__schema" | "__type"
                    )),
                }
                .add(self.selection_set_cost(&field.node.selection_set.node)),
                Selection::FragmentSpread(spread) => DocumentCost {
                    selections: 1,
                    directives: spread.node.directives.len() as u64,
                    ..DocumentCost::default()
                }
                .add(
                    self.cost_of(&spread.node.fragment_name.node)
                        .unwrap_or_default(),
                ),
                Selection::InlineFragment(inline) => DocumentCost {
                    selections: 1,
                    directives: inline.node.directives.len() as u64,
                    ..DocumentCost::default()
                }
                .add(self.selection_set_cost(&inline.node.selection_set.node)),
            })
            .fold(DocumentCost::default(), DocumentCost::add)
    }
}

/// The fragments spread anywhere in `selection_set`, without following them.
fn spreads_in<'a>(selection_set: &'a SelectionSet, spreads: &mut Vec<&'a Name>) {
    for selection in &selection_set.items {
        match &selection.node {
            Selection::Field(field) => spreads_in(&field.node.selection_set.node, spreads),
            Selection::FragmentSpread(spread) => spreads.push(&spread.node.fragment_name.node),
            Selection::InlineFragment(inline) => {
                spreads_in(&inline.node.selection_set.node, spreads);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use async_graphql::parser::parse_query;

    fn fragment_bomb(levels: usize) -> String {
        let mut query = String::from("query{...F0}");
        for level in 0..levels {
            query.push_str(&format!(
                " fragment F{level} on QueryRoot{{...F{next} ...F{next}}}",
                next = level + 1
            ));
        }
        query.push_str(&format!(" fragment F{levels} on QueryRoot{{__typename}}"));
        query
    }

    #[test]
    fn a_fragment_spread_twice_counts_twice_without_being_expanded() {
        let document = parse_query(fragment_bomb(30)).unwrap();
        let cost = measure(&document).unwrap();
        // 2^30 leaves under the operation alone.
        assert!(cost.selections > 1 << 30, "{cost:?}");
        assert!(matches!(
            check_document(&document, &QueryBudget::AUTHENTICATED),
            Err(CostError::TooManySelections { .. })
        ));
    }

    #[test]
    fn fragment_counts_are_exact() {
        let document =
            parse_query("{ a: __typename ...F ...F } fragment F on QueryRoot { b: __typename @skip(if: false) }")
                .unwrap();
        // The operation: one field and two spreads of F (2 selections each with F's
        // field); the definition of F once more.
        assert_eq!(
            measure(&document).unwrap(),
            DocumentCost {
                selections: 3 + 2 + 1,
                aliases: 1 + 2 + 1,
                directives: 2 + 1,
                introspections: 0,
            }
        );
    }

    #[test]
    fn introspection_fields_are_counted_through_fragments() {
        let document = parse_query(
            "{ a: __schema { queryType { name } } ...F } fragment F on QueryRoot { b: __type(name: \"Job\") { name } }",
        )
        .unwrap();
        // One in the operation, one through the spread, and F's definition once more.
        assert_eq!(measure(&document).unwrap().introspections, 3);
        assert!(matches!(
            check_document(&document, &QueryBudget::ANONYMOUS),
            Err(CostError::TooManyIntrospections { count: 3, limit: 2 })
        ));
    }

    #[test]
    fn cycles_are_refused() {
        let document = parse_query(
            "{...A} fragment A on QueryRoot {...B} fragment B on QueryRoot {__typename ...A}",
        )
        .unwrap();
        assert!(matches!(
            measure(&document),
            Err(CostError::FragmentCycle(_))
        ));
    }
}
