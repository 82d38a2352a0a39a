package remote

import (
	"context"

	"github.com/ferryfs/ferry"
)

// SendAgain makes the Commit call of a committed group once more, as a
// client whose answer was lost does.
func SendAgain(ctx context.Context, g ferry.Group) ([]ferry.Dir, error) {
	return g.(*group).send(ctx)
}
