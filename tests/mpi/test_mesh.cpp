#include "mpi_test.hpp"
