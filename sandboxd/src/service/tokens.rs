//! Session tokens: looked up (through a cache), rotated and granted. How a token is made and
//! compared is [`crate::service::auth`]'s.

use super::*;

impl Core {
    /// The session a token belongs to, if any.
    pub async fn session_of_token(&self, token: &str) -> Result<Option<String>, ServiceError> {
        let hash = auth::hash(token);
        let generation = {
            let c = self
                .token_cache
                .lock()
                .map_err(|_| ServiceError::internal("token cache poisoned"))?;
            if let Some(id) = c.1.get(&hash) {
                return Ok(Some(id.clone()));
            }
            c.0
        };
        let id = self
            .store
            .by_token_hash(&hash)
            .await
            .map_err(db)?
            .map(|r| r.id);
        if let (Some(id), Ok(mut c)) = (&id, self.token_cache.lock())
            && c.0 == generation
        {
            c.1.insert(hash, id.clone());
        }
        Ok(id)
    }

    /// Forgets the cached tokens of a session (before its tokens change or its row goes).
    pub(super) fn forget_tokens(&self, id: &str) {
        if let Ok(mut c) = self.token_cache.lock() {
            c.0 += 1;
            c.1.retain(|_, session| session != id);
        }
    }

    /// Gives a session a new token (the old one stops working) and returns it.
    pub async fn rotate_token(&self, id: &str) -> Result<String, ServiceError> {
        self.rotate_token_as(id, None).await
    }

    /// [`Core::rotate_token`] for `owner`: a session another owner holds keeps its token
    /// ([`ServiceError::OwnerMismatch`]); one without an owner is adopted. `None` rotates whoever owns it.
    pub async fn rotate_token_as(
        &self,
        id: &str,
        owner: Option<&str>,
    ) -> Result<String, ServiceError> {
        if let Some(owner) = owner
            && !valid_owner(owner)
        {
            return Err(ServiceError::invalid(format!(
                "owner '{owner}' is not an owner: 1 to 128 visible ASCII characters (send the object's uid)"
            )));
        }
        let row = self.row(id).await?;
        self.owned_by(row, owner).await?;
        let token = auth::new_session_token();
        let set = self.store.set_token_hash(id, &auth::hash(&token)).await;
        // After the change (a lookup racing it does not cache: the generation moved on).
        self.forget_tokens(id);
        set.map_err(db)?;
        Ok(token)
    }

    /// Gives a session one more token beside the ones it has (those keep working) and returns
    /// it; only its hash is kept. The wire surface hands one to every caller that attaches.
    pub async fn grant_token(&self, id: &str) -> Result<String, ServiceError> {
        let token = auth::new_session_token();
        if !self
            .store
            .add_token_hash(id, &auth::hash(&token))
            .await
            .map_err(db)?
        {
            return Err(ServiceError::NoSuchSession { id: id.to_owned() });
        }
        Ok(token)
    }
}
