package proto

// The kinds of Change in a Commit.
const (
	ChangePut    = 1 // A whole file put, or a directory, link or device made.
	ChangeRemove = 2
	ChangeMove   = 3
	ChangeWstat  = 4
)

// Limits of a Commit: CommitInline bounds the file data its messages carry
// (larger files are staged by chunked puts first), CommitChanges the
// changes of one group. A client cuts its groups to fit.
const (
	CommitInline  = 16 << 20
	CommitChanges = 1 << 16
)
