//! One handler per request kind. Each takes the request's [`Cx`] and
//! calls down (books, services, shared operations), never into another
//! handler: what two of them share lives below, in [`super::instances`],
//! [`super::queue`], [`super::reap`] or [`super::requeue`].

use super::context::Cx;
use crate::protocol::{ok_line, ErrorBody, Request};

mod allocate;
mod apply;
mod health;
mod plan;
mod reconcile;
mod release;
mod status;

/// Serves an authorised request and encodes its reply line; `peer` is the
/// caller's uid (what `status` and `plan` show depends on it).
pub(super) async fn dispatch(
    cx: &Cx<'_>,
    request: Request,
    peer: u32,
) -> Result<String, ErrorBody> {
    match request {
        Request::Allocate(req) => allocate::serve(cx, req).await.map(|r| ok_line(&r)),
        Request::Release(req) => release::serve(cx, req).await.map(|r| ok_line(&r)),
        Request::Status => Ok(ok_line(&status::serve(cx, peer).await)),
        Request::Reconcile => reconcile::serve(cx).await.map(|r| ok_line(&r)),
        Request::Plan => Ok(ok_line(&plan::serve(cx, peer))),
        Request::Apply(req) => apply::serve(cx, req.plan).await.map(|r| ok_line(&r)),
        Request::Health => Ok(ok_line(&health::serve(cx))),
    }
}
