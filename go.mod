module github.com/ferryfs/ferry

go 1.26.8
