! Trains a ConvNet through the `lockstep` Fortran module on batches a Fortran
! code holds in its own arrays: real(4) images, or the same values as real(8)
! (a simulation's usual kind), with integer(4) labels. The values are whole
! numbers from 0 to 255, which float32 holds exactly, so the two kinds must
! train bitwise alike (tests/capi/capi_test.cpp compares the final checkpoints).
!
!   capi_train_fortran CONFIG WORK_DIR ITERS BATCH real4|real8
!
! Exit status 0 on success; 1 with the status and message on stderr.
program capi_train_fortran
  use, intrinsic :: iso_c_binding
  use, intrinsic :: iso_fortran_env, only: error_unit
  use lockstep
  implicit none
  character(len=4096) :: config, work_dir, text, kind
  character(len=4200) :: overrides(1)
  integer :: iters, batch, step, status, i, j, b
  type(lockstep_trainer) :: trainer
  real(c_float), allocatable, target :: x4(:, :, :, :)
  real(c_double), allocatable, target :: x8(:, :, :, :)
  integer(c_int32_t), allocatable, target :: labels(:)
  real(c_double) :: loss

  if (command_argument_count() /= 5) then
    write (error_unit, '(a)') 'usage: capi_train_fortran CONFIG WORK_DIR ITERS BATCH real4|real8'
    stop 2
  end if
  call get_command_argument(1, config)
  call get_command_argument(2, work_dir)
  call get_command_argument(3, text)
  read (text, *) iters
  call get_command_argument(4, text)
  read (text, *) batch
  call get_command_argument(5, kind)

  ! (x, y, channel, sample): the tensor [batch, 1, 28, 28].
  allocate(x4(28, 28, 1, batch), x8(28, 28, 1, batch), labels(batch))
  ! (gfortran 12 writes past the end of a typed array constructor of a concatenation)
  overrides(1) = 'work_dir=' // trim(work_dir)
  status = lockstep_create(trainer, trim(config), overrides)
  call check('lockstep_create', status)
  do step = 0, iters - 1
    do b = 1, batch
      do j = 1, 28
        do i = 1, 28
          x4(i, j, 1, b) = real(mod(i * 7 + j * 13 + b * 31 + step * 17, 256), c_float)
        end do
      end do
      labels(b) = int(mod(b + step * 3, 10), c_int32_t)
    end do
    x8 = real(x4, c_double)
    if (trim(kind) == 'real8') then
      status = lockstep_train_step(trainer, lockstep_array(x8), lockstep_array(labels), loss)
    else
      status = lockstep_train_step(trainer, lockstep_array(x4), lockstep_array(labels), loss)
    end if
    call check('lockstep_train_step', status)
  end do
  write (*, '(a, a, a, f8.4)') 'capi_train_fortran: ', trim(kind), ' last loss ', loss
  status = lockstep_destroy(trainer)
  call check('lockstep_destroy', status)

contains

  subroutine check(what, status)
    character(len=*), intent(in) :: what
    integer, intent(in) :: status
    if (status /= LOCKSTEP_OK) then
      write (error_unit, '(a, a, i0, a, a)') what, ' failed (status ', status, '): ', lockstep_error()
      stop 1
    end if
  end subroutine

end program
