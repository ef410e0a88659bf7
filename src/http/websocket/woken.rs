//! Polls a connection's subscriptions only when something woke them.
//!
//! async-graphql's WebSocket connection keeps its subscriptions in a map and, on every
//! wake, polls each of them in turn until one has a message; it hands that message
//! over and, for the next one, starts again from the first. An event of a tenant with
//! 100 account streams on one connection is then 100 messages, each costing a poll of
//! up to 100 streams that have nothing to say, and each of those polls runs down
//! through async-graphql's extensions to the bus receiver: O(n²) work per event on
//! the connection's task, which other requests waited behind. Wrapped here, a stream
//! that nobody woke since it last said "pending" answers so at once, without being
//! polled, so an event costs each stream one real poll.

use async_graphql::{Data, Executor, Request, Response};
use futures_util::stream::{BoxStream, Stream, StreamExt};
use futures_util::task::{ArcWake, AtomicWaker, waker_ref};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

/// An executor whose subscription streams are polled only when woken.
#[derive(Clone)]
pub struct WokenOnly<E>(pub E);

impl<E: Executor> Executor for WokenOnly<E> {
    fn execute(&self, request: Request) -> impl Future<Output = Response> + Send {
        self.0.execute(request)
    }

    fn execute_stream(
        &self,
        request: Request,
        session_data: Option<Arc<Data>>,
    ) -> BoxStream<'static, Response> {
        Box::pin(PolledWhenWoken::new(
            self.0.execute_stream(request, session_data),
        ))
    }
}

/// A stream that skips polling its inner stream until the inner stream's waker fired.
struct PolledWhenWoken<S> {
    inner: S,
    wake: Arc<Wake>,
}

/// The waker handed to the inner stream: it records that the stream must be polled,
/// then wakes the connection's task.
struct Wake {
    woken: AtomicBool,
    task: AtomicWaker,
}

impl ArcWake for Wake {
    fn wake_by_ref(wake: &Arc<Self>) {
        wake.woken.store(true, Ordering::Release);
        wake.task.wake();
    }
}

impl<S> PolledWhenWoken<S> {
    fn new(inner: S) -> Self {
        Self {
            inner,
            // A new stream has not been polled yet: its first poll starts it.
            wake: Arc::new(Wake {
                woken: AtomicBool::new(true),
                task: AtomicWaker::new(),
            }),
        }
    }
}

impl<S: Stream + Unpin> Stream for PolledWhenWoken<S> {
    type Item = S::Item;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<S::Item>> {
        // Registered before the flag is read, so a wake in between is not lost.
        self.wake.task.register(cx.waker());
        if !self.wake.woken.swap(false, Ordering::AcqRel) {
            return Poll::Pending;
        }
        let wake = self.wake.clone();
        let waker = waker_ref(&wake);
        let polled = self.inner.poll_next_unpin(&mut Context::from_waker(&waker));
        if polled.is_ready() {
            // A stream that had one message ready may have more without waking again.
            self.wake.woken.store(true, Ordering::Release);
        }
        polled
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::stream;
    use std::sync::atomic::AtomicUsize;

    /// Counts how often the wrapped stream is polled.
    fn counted<S: Stream + Unpin>(
        inner: S,
        polls: Arc<AtomicUsize>,
    ) -> impl Stream<Item = S::Item> + Unpin {
        let mut inner = inner;
        stream::poll_fn(move |cx| {
            polls.fetch_add(1, Ordering::Relaxed);
            inner.poll_next_unpin(cx)
        })
    }

    #[tokio::test]
    async fn a_stream_nobody_woke_is_not_polled_again() {
        let (sender, receiver) = tokio::sync::mpsc::unbounded_channel::<u32>();
        let polls = Arc::new(AtomicUsize::new(0));
        let mut woken = PolledWhenWoken::new(counted(
            tokio_stream::wrappers::UnboundedReceiverStream::new(receiver),
            polls.clone(),
        ));
        let noop = futures_util::task::noop_waker();
        let mut cx = Context::from_waker(&noop);
        assert!(woken.poll_next_unpin(&mut cx).is_pending());
        assert!(woken.poll_next_unpin(&mut cx).is_pending());
        assert_eq!(polls.load(Ordering::Relaxed), 1);

        sender.send(1).unwrap();
        sender.send(2).unwrap();
        assert_eq!(woken.poll_next_unpin(&mut cx), Poll::Ready(Some(1)));
        // The second message needs no new wake.
        assert_eq!(woken.poll_next_unpin(&mut cx), Poll::Ready(Some(2)));
        assert!(woken.poll_next_unpin(&mut cx).is_pending());
        assert!(woken.poll_next_unpin(&mut cx).is_pending());
        assert_eq!(polls.load(Ordering::Relaxed), 4);

        drop(sender);
        assert_eq!(woken.poll_next_unpin(&mut cx), Poll::Ready(None));
    }
}
