//! Who may read, or act for, whose records (contract §4): the one rule every route applies, the
//! REST and GraphQL reads, the log's proofs, the subscriptions and a bulk request's items. An
//! admin may name any user, or none for everyone; a user only themself. A record of another user
//! is, to a user, as if it did not exist, except where they named that user themself, which is
//! refused outright (FORBIDDEN).

use domain::{ErrorCode, UserId};

/// Who calls, as their token says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caller {
    pub user: UserId,
    pub admin: bool,
}

impl Caller {
    /// Whether the caller may see a record owned by `owner`.
    pub fn may_see(self, owner: UserId) -> bool {
        self.admin || owner == self.user
    }

    /// Whether the caller may see a stored record whose owner is `owner` (a raw stored user id;
    /// a record of no user, such as a deposit's entry with none, only an admin).
    pub fn may_see_stored(self, owner: Option<i64>) -> bool {
        self.admin || owner == Some(self.user.as_i64())
    }

    /// The one user a read of one user's records is about: `named`, or the caller when none is
    /// named. A user naming another is FORBIDDEN.
    pub fn one_user(self, named: Option<UserId>) -> Result<UserId, ErrorCode> {
        match named {
            None => Ok(self.user),
            Some(user) if self.may_see(user) => Ok(user),
            Some(_) => Err(ErrorCode::Forbidden),
        }
    }

    /// The user a listing is about: an admin's, `named` or everyone's (`None`); a user's, their
    /// own always. A user naming another is FORBIDDEN.
    pub fn listing(self, named: Option<UserId>) -> Result<Option<UserId>, ErrorCode> {
        match (self.admin, named) {
            (true, named) => Ok(named),
            (false, Some(user)) if user != self.user => Err(ErrorCode::Forbidden),
            (false, _) => Ok(Some(self.user)),
        }
    }

    /// Whether the caller may name the user a command acts for (an admin's back office names
    /// one per bulk item). A user's token moves only its own money and names no user, not even
    /// itself: FORBIDDEN.
    pub fn may_name_users(self) -> bool {
        self.admin
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(n: u64) -> UserId {
        UserId::new(n).unwrap()
    }

    fn admin() -> Caller {
        Caller {
            user: user(1),
            admin: true,
        }
    }

    fn seven() -> Caller {
        Caller {
            user: user(7),
            admin: false,
        }
    }

    #[test]
    fn a_user_sees_only_their_own_and_an_admin_everyones() {
        assert!(seven().may_see(user(7)));
        assert!(!seven().may_see(user(8)));
        assert!(admin().may_see(user(8)));
        assert!(seven().may_see_stored(Some(7)));
        assert!(!seven().may_see_stored(Some(8)));
        assert!(!seven().may_see_stored(None));
        assert!(admin().may_see_stored(None));
    }

    #[test]
    fn a_user_naming_another_is_forbidden_and_an_admin_names_anyone_or_no_one() {
        assert_eq!(seven().one_user(None), Ok(user(7)));
        assert_eq!(seven().one_user(Some(user(7))), Ok(user(7)));
        assert_eq!(seven().one_user(Some(user(8))), Err(ErrorCode::Forbidden));
        assert_eq!(admin().one_user(Some(user(8))), Ok(user(8)));
        assert_eq!(seven().listing(None), Ok(Some(user(7))));
        assert_eq!(seven().listing(Some(user(8))), Err(ErrorCode::Forbidden));
        assert_eq!(admin().listing(None), Ok(None));
        assert_eq!(admin().listing(Some(user(8))), Ok(Some(user(8))));
    }

    #[test]
    fn only_an_admin_names_the_user_a_command_acts_for() {
        assert!(!seven().may_name_users());
        assert!(admin().may_name_users());
    }
}
